"""Stopping a run cleanly: SIGTERM, or a first Ctrl-C, asks the loop to finish its step,
checkpoint and return; a second Ctrl-C interrupts at once, as usual."""

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
def stop_requests() -> Iterator[StopRequest]:
    """Within the block SIGTERM and SIGINT set the yielded request instead of interrupting."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # signal handlers can only be installed from the main thread
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: object) -> None:
        request.signal = signal.Signals(signum).name
        signal.signal(signal.SIGINT, previous[signal.SIGINT])  # so a second Ctrl-C interrupts

    for s in previous:
        signal.signal(s, handler)
    try:
        yield request
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
