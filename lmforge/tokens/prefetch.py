"""A background thread that runs a pure producer ahead of its consumer through a bounded queue.

The producer maps a state to (item, next state). Each queued item carries the state after it,
so the consumer's state is that of the items it took, never of those merely produced.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

S = TypeVar("S")


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(Generic[S]):
    """Produces up to `depth` items ahead in a daemon thread, starting from `state`."""

    def __init__(self, produce: Callable[[S], tuple[Any, S]], state: S, depth: int) -> None:
        self._produce = produce
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(state,), daemon=True)
        self._thread.start()

    def _run(self, state: S) -> None:
        while not self._stop.is_set():
            try:
                item, state = self._produce(state)
                entry: Any = (item, state)
            except BaseException as e:  # handed to the consumer, which re-raises it
                entry = _Failed(e)
            while not self._stop.is_set():
                try:
                    self._queue.put(entry, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(entry, _Failed):
                return

    def get(self) -> tuple[Any, S]:
        """The next (item, state after it); re-raises what the producer raised."""
        if self._error is not None:
            raise self._error
        entry = self._queue.get()
        if isinstance(entry, _Failed):
            self._error = entry.error
            raise entry.error
        return entry

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()  # unblocks a producer waiting to put
            except queue.Empty:
                self._thread.join(timeout=0.05)
