"""Writing a file so that its readers see the old file or the whole new one, never half of one.

The text goes to a temporary sibling first (its name unique to this process, so two processes
writing the same file never share one), which `os.replace` then renames over the target: the
rename is atomic within a directory. A failed write removes the temporary and leaves any old
file as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


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
