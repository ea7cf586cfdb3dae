"""A disk that fills up during a write, portably (no small file system to mount): a module's
`open` replaced by one whose chosen files take `room` bytes, then raise OSError(ENOSPC) as a
full disk does, the bytes that fitted written. The real thing, a small tmpfs, is tried by hand.
"""

from __future__ import annotations

import builtins
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


class _Filling:
    """A file object that holds `room` more bytes, then refuses the rest."""

    def __init__(self, f: Any, room: int) -> None:
        self._f, self._room = f, room

    def write(self, data: Any) -> int:
        whole = data if isinstance(data, str) else memoryview(data).cast("B")
        fits = whole[: self._room]  # a text file's characters count as bytes: ASCII here
        self._f.write(fits)
        self._room -= len(fits)
        if len(fits) < len(whole):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(fits)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> _Filling:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


def fill_disk(monkeypatch, module: Any, victim: Callable[[Path], bool], room: int = 64) -> None:
    """`module`'s `open` gives the files `victim` picks (opened for writing) `room` bytes."""
    real_open = builtins.open

    def opener(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if any(c in mode for c in "wax") and victim(Path(file)):
            return _Filling(f, room)
        return f

    monkeypatch.setattr(module, "open", opener, raising=False)
