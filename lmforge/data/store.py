"""Writing and reading document sets as JSON Lines, atomically."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from lmforge.data.documents import Document


def write_jsonl(path: str | Path, docs: Iterable[Document]) -> int:
    """Write documents to `path` through a temporary file; returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(doc.to_json())
            f.write("\n")
            count += 1
    os.replace(tmp, path)
    return count


def read_jsonl(path: str | Path) -> Iterator[Document]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield Document.from_json(line)
