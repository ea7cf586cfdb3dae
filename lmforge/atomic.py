"""Writing a file so that its readers see the old file or the whole new one, never half of one.

The text goes to a temporary sibling first (its name unique to this process, so two processes
writing the same file never share one), which `os.replace` then renames over the target: the
rename is atomic within a directory. A failed write removes the temporary and leaves any old
file as it was.

A write that fails because the disk (or the user's quota) is full says so in one line through
`disk_full_is_an_error`, wherever a run writes what it resumes from: checkpoints and the
metrics log (train/checkpointer.py, train/metrics.py), the data pipeline's shards
(data/pipeline/passes.py) and token shards (tokens/shards.py).
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How libraries that do their own I/O word a full disk: safetensors (Rust) ends its message
# with "No space left on device (os error 28)", or "Disk quota exceeded (os error 122)".
_DISK_FULL_WORDS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically, creating its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """Write `obj` as JSON (and a final newline) to `path` atomically; returns the path."""
    return write_text(path, json.dumps(obj, indent=indent) + "\n")


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` is a full disk or quota: an OSError with ENOSPC or EDQUOT, a library's
    error whose message says so (safetensors), or any error raised while handling or from one
    (torch.save into a file object raises a RuntimeError in the middle of the OSError)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        if any(words in str(e) for words in _DISK_FULL_WORDS):
            return True
        todo += [e.__cause__, e.__context__]
    return False


@contextmanager
def disk_full_is_an_error(what: str, path: str | os.PathLike, fix: str) -> Iterator[None]:
    """Within the block, a full disk becomes one LmforgeError: "no space left on the device
    writing {what} {path}: {fix}". Every other error passes through unchanged."""
    try:
        yield
    except LmforgeError:
        raise
    except Exception as e:
        if not is_disk_full(e):
            raise
        raise LmforgeError(
            f"no space left on the device writing {what} {path} (disk full): {fix}"
        ) from None
