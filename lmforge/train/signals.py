"""Stopping a run cleanly: SIGTERM, or a first Ctrl-C, asks the loop to finish its step,
checkpoint and return; a second Ctrl-C interrupts at once, as usual.

A command whose run was stopped then exits as the shell expects of a process a signal stopped,
128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM), so `lmforge train && lmforge
export` does not go on to export a run that has not finished.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


def exit_status(signal_name: str | None) -> int:
    """128 + the number of the signal that stopped a run (SIGINT's 130 when none is named)."""
    number = signal.Signals.__members__.get(signal_name or "", signal.SIGINT)
    return 128 + int(number)


def stopped_message(signal_name: str | None, step: int, checkpoint: object) -> str:
    why = f"{signal_name} received" if signal_name else "interrupted"
    return (
        f"stopped ({why}) at step {step}; checkpoint {checkpoint}: run the same command again "
        "to resume from it (--fresh starts over)"
    )


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
