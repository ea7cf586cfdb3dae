"""The readers of each input format: one function per kind of `Unit`, all in `READERS`.

Each yields the documents of one unit and reports what it skips (binary, non-UTF-8, bad lines,
corrupt records) into the `read` step's stats; `readers.read_shard` adds the checks common to
every format and turns a damaged stream into a counted reason.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.data.documents import Document, split_text, stdlib_root
from lmforge.data.stats import StepStats
from lmforge.data.streams import TruncatedFile, read_all, read_chunks, read_lines, strip_compression
from lmforge.extras import import_extra

if TYPE_CHECKING:
    from lmforge.data.read_units import ReadConfig, Unit


def _is_binary(data: bytes) -> bool:
    return b"\x00" in data[:8192]


def _decode(raw: bytes, unit: Unit, stats: StepStats) -> str | None:
    if _is_binary(raw):
        stats.remove("binary_file", unit.path)
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        stats.remove("not_utf8", unit.path)
        return None


def _whole(unit: Unit, stats: StepStats) -> bytes:
    """The file's bytes; a truncated compressed file gives what precedes the cut line."""
    pieces: list[bytes] = []
    try:
        for chunk in read_chunks(unit.path):
            pieces.append(chunk)
    except TruncatedFile:
        stats.remove("truncated_file", unit.path)
        data = b"".join(pieces)
        return data[: data.rfind(b"\n") + 1]
    return b"".join(pieces)


def _text(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    text = _decode(_whole(unit, stats), unit, stats)
    if not text:
        return
    pieces = split_text(text, cfg.doc_separator, cfg.txt_chunk_bytes)
    if not cfg.txt_chunk_bytes:
        whole = list(pieces)
        if len(whole) == 1:  # no separator line: the file is one document, named as the file
            yield Document(unit.doc_id, whole[0], {"format": "text"})
            return
        pieces = iter(whole)
    for index, piece in enumerate(pieces):
        yield Document(f"{unit.doc_id}#{index}", piece)


def _code(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    text = _decode(read_all(unit.path), unit, stats)
    if text is not None:
        lang = Path(strip_compression(unit.path)).suffix.lstrip(".")
        yield Document(unit.doc_id, text, {"format": "code", "lang": lang})


def _stdlib(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    text = _decode(Path(unit.path).read_bytes(), unit, stats)
    if text is not None:
        rel = Path(unit.path).relative_to(stdlib_root()).as_posix()
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        yield Document(f"stdlib/{rel}", text, {"source": version, "format": "code", "lang": "py"})


def _html(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    from lmforge.data.html import decode_html

    raw = read_all(unit.path)
    if _is_binary(raw):
        stats.remove("binary_file", unit.path)
        return
    html, encoding = decode_html(raw)
    yield Document(unit.doc_id, html, {"format": "html", "encoding": encoding})


def _record(obj: dict, default_id: str, cfg: ReadConfig) -> Document | None:
    text = obj.get(cfg.text_key)
    if not isinstance(text, str):
        return None
    meta = dict(obj["meta"]) if isinstance(obj.get("meta"), dict) else {}
    for key, value in obj.items():
        if key not in (cfg.text_key, cfg.id_key, "meta"):
            meta[key] = value
    doc_id = obj.get(cfg.id_key)
    return Document(str(doc_id) if doc_id is not None else default_id, text, meta)


def _jsonl(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    for number, line in enumerate(read_lines(unit.path), start=1):
        if not line.strip():
            continue
        where = f"{unit.path}:{number}"
        try:
            obj = json.loads(line)
        except UnicodeDecodeError:
            stats.remove("not_utf8", where)
            continue
        except ValueError:
            stats.remove("bad_json", where, line[:200].decode("utf-8", "replace"))
            continue
        doc = _record(obj, f"{unit.doc_id}:{number}", cfg) if isinstance(obj, dict) else None
        if doc is None:
            stats.remove("no_text_field", where, line[:200].decode("utf-8", "replace"))
            continue
        yield doc


def _parquet(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    pq = import_extra("pyarrow.parquet", "reading Parquet files", "parquet")
    file = pq.ParquetFile(unit.path)
    row = 0
    for batch in file.iter_batches(batch_size=1024):
        for obj in batch.to_pylist():
            row += 1
            doc = _record(obj, f"{unit.doc_id}:{row}", cfg)
            if doc is None:
                stats.remove("no_text_field", f"{unit.path}:{row}")
                continue
            if isinstance(doc.meta.get("meta"), str):
                doc.meta.update(json.loads(doc.meta.pop("meta")))
            yield doc


def _warc(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    from lmforge.data.warc import warc_documents

    return warc_documents(Path(unit.path), stats)


def _tar(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    from lmforge.data.stats import ReadStats
    from lmforge.data.webdataset import tar_documents

    counts = ReadStats()
    try:
        for doc_id, text, meta in tar_documents(Path(unit.path), counts):
            yield Document(doc_id, text, meta)
    finally:
        for _ in range(counts.skipped_not_utf8):
            stats.remove("not_utf8", unit.path)


def _hf(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    import datasets

    rows = datasets.load_dataset(unit.path, split=cfg.hf_split, streaming=True)
    for index, obj in enumerate(rows):
        doc = _record(obj, f"hf:{unit.path}:{index}", cfg)
        if doc is None:
            stats.remove("no_text_field", f"hf:{unit.path}:{index}")
            continue
        yield doc


def _unsupported(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    stats.remove("unsupported_file", unit.path)
    return iter(())


READERS = {
    "text": _text,
    "code": _code,
    "stdlib": _stdlib,
    "html": _html,
    "jsonl": _jsonl,
    "parquet": _parquet,
    "warc": _warc,
    "tar": _tar,
    "hf": _hf,
    "unsupported": _unsupported,
}
