"""Reading raw documents: the built-in stdlib corpus, .txt, JSONL and .tar files, and folders.

A document is `{"id", "text", "meta"}` (DESIGN.md, "Documents"). Readers are generators holding
one file in memory at a time; files that are not UTF-8 are skipped, counted and warned about once.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.data.stats import ReadStats
from lmforge.data.webdataset import is_tar, tar_documents
from lmforge.errors import LmforgeError

TXT_CHUNK_BYTES = 32 * 1024
"""A .txt file is cut into documents of about this size at line boundaries, so one big
file (a book, a dump) still yields many documents for deduplication and the validation split."""

DOC_SEPARATOR = "<|endoftext|>"
"""A .txt line that is exactly this (surrounding whitespace aside) ends one document and starts
the next, as in TinyStories and OpenWebText dumps; the line itself is dropped, so the tokenizer's
end-of-text token, not the literal characters, separates the documents."""


@dataclass
class Document:
    id: str
    text: str
    meta: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "text": self.text, "meta": self.meta}, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Document:
        obj = json.loads(line)
        return cls(id=obj["id"], text=obj["text"], meta=obj.get("meta", {}))


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_documents(stats: ReadStats | None = None) -> Iterator[Document]:
    """One document per .py file of the running interpreter's standard library."""
    root = stdlib_root()
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for path in files:
        text = _read_utf8(path, stats)
        if text:
            rel = path.relative_to(root).as_posix()
            yield _counted(Document(f"stdlib/{rel}", text, {"source": f"python{version}"}), stats)


def source_name(root: Path, file: Path) -> str:
    """How document ids name `file`, read from the input `root` (a folder or the file itself).

    The folder's own name and the path within it, or a lone file's name: not the path as typed,
    so ids, and the validation split hashed from them, do not change with where the corpus
    lives or how its path is spelled.
    """
    if file == root:
        return file.name
    return f"{root.resolve().name}/{file.relative_to(root).as_posix()}"


def split_text(
    text: str, separator: str = DOC_SEPARATOR, chunk_bytes: int = TXT_CHUNK_BYTES
) -> Iterator[str]:
    """The documents of a .txt file's `text`: split at lines that are exactly `separator` ("":
    never), each then cut at the first line boundary past `chunk_bytes` (0: never cut).

    Pieces holding only whitespace are dropped. Without a separator line the pieces are those
    of the chunking alone, so document ids `file#N` stay what they were.
    """
    lines = text.splitlines(keepends=True)
    chunk: list[str] = []
    size = 0
    check = bool(separator) and separator in text
    for line in lines:
        if check and line.strip() == separator:
            if "".join(chunk).strip():
                yield "".join(chunk)
            chunk, size = [], 0
            continue
        chunk.append(line)
        size += len(line)
        if chunk_bytes and size >= chunk_bytes:
            yield "".join(chunk)
            chunk, size = [], 0
    if chunk and (not check or "".join(chunk).strip()):
        yield "".join(chunk)


def read_documents(
    path: str | Path, stats: ReadStats | None = None, separator: str = DOC_SEPARATOR
) -> Iterator[Document]:
    """Documents from a .txt, JSONL (`text` field) or WebDataset .tar file, or a folder of them;
    a .txt is split at `separator` lines (`split_text`)."""
    root = Path(path)
    if not root.exists():
        raise LmforgeError(f"data path {root} does not exist: pass an existing file or folder")
    files = sorted(_data_files(root)) if root.is_dir() else [root]
    if not files:
        raise LmforgeError(
            f"folder {root} holds no .txt, .jsonl or .tar files: add some or pass a file"
        )
    for file in files:
        if is_tar(file):
            for doc_id, text, meta in tar_documents(file, stats):
                yield _counted(Document(doc_id, text, meta), stats)
        elif file.suffix == ".jsonl":
            yield from _jsonl_documents(file, source_name(root, file), stats)
        else:
            yield from _txt_documents(file, source_name(root, file), stats, separator)


def _data_files(folder: Path) -> Iterable[Path]:
    return (
        p
        for p in folder.rglob("*")
        if p.is_file() and (p.suffix in (".txt", ".jsonl") or is_tar(p))
    )


def _read_utf8(path: Path, stats: ReadStats | None) -> str | None:
    if stats is not None:
        stats.files += 1
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        if stats is not None:
            if stats.skipped_not_utf8 == 0:
                print(f"warning: skipping {path}: not UTF-8 (more are counted)", file=sys.stderr)
            stats.skipped_not_utf8 += 1
        return None


def _counted(doc: Document, stats: ReadStats | None) -> Document:
    if stats is not None:
        stats.documents += 1
        stats.bytes += len(doc.text.encode("utf-8"))
    return doc


def _txt_documents(
    path: Path, name: str, stats: ReadStats | None, separator: str
) -> Iterator[Document]:
    text = _read_utf8(path, stats)
    if not text:
        return
    for index, piece in enumerate(split_text(text, separator)):
        yield _counted(Document(f"{name}#{index}", piece), stats)


def _jsonl_documents(path: Path, name: str, stats: ReadStats | None) -> Iterator[Document]:
    text = _read_utf8(path, stats)
    if text is None:
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            body = obj["text"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise LmforgeError(
                f"{path}:{number} is not a JSON object with a 'text' field: fix or remove that line"
            ) from e
        if isinstance(body, str) and body:
            doc_id = str(obj.get("id", f"{name}:{number}"))
            yield _counted(Document(doc_id, body, obj.get("meta", {})), stats)
