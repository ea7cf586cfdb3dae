"""SIGTERM handled like Ctrl-C: the loop finishes its step, checkpoints and returns."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class StopRequest:
    def __init__(self) -> None:
        self.signal: str | None = None

    def __bool__(self) -> bool:
        return self.signal is not None


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[StopRequest]:
    """Within the block SIGTERM sets the yielded request instead of killing the process."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # signal handlers can only be installed from the main thread
        return

    def handler(signum: int, frame: object) -> None:
        request.signal = signal.Signals(signum).name

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield request
    finally:
        signal.signal(signal.SIGTERM, previous)
