"""The pipeline's readers: input paths to shards of documents, bad input counted and skipped.

Inputs are files, folders (walked for known formats), `stdlib` (the interpreter's standard
library source) or `hf:NAME` (a Hugging Face dataset, streamed; needs `datasets` and a network).
Formats are known by name: .txt/.md (cut into ~32 KB documents like `read_documents`), source
code (one document per file), JSONL (.gz/.zst too), Parquet, WARC/WET, HTML, WebDataset tar.
Anything damaged — a truncated or corrupt stream, a bad line, binary or non-UTF-8 bytes, an
empty or oversized document — becomes a reason in the `read` step's stats, never an exception,
and the documents read before the damage are kept.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lmforge.data.documents import TXT_CHUNK_BYTES, Document, stdlib_root
from lmforge.data.pipeline.stats import StepStats
from lmforge.data.streams import CorruptFile, TruncatedFile, read_all, read_lines, strip_compression
from lmforge.errors import LmforgeError

CODE_SUFFIXES = frozenset(
    {".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go", ".java", ".js", ".ts"}
    | {".jsx", ".tsx", ".rb", ".php", ".cs", ".swift", ".kt", ".scala", ".sh", ".lua", ".sql"}
)
TEXT_SUFFIXES = frozenset((".txt", ".md", ".rst", ".text"))


@dataclass
class ReadConfig:
    shard_bytes: int = 16_000_000  # input files are grouped into shards of about this size
    max_doc_bytes: int = 10_000_000  # larger documents are skipped as `too_large`
    txt_chunk_bytes: int = TXT_CHUNK_BYTES  # 0: one document per .txt file
    text_key: str = "text"  # JSONL/Parquet/HF field holding the text
    id_key: str = "id"
    hf_split: str = "train"


@dataclass(frozen=True)
class Unit:
    """One readable input: a file of a known kind, a stdlib file, or a HF dataset."""

    kind: str
    path: str
    size: int = 0


def file_kind(path: Path) -> str | None:
    name = strip_compression(path.name.lower())
    suffix = Path(name).suffix
    if name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
        return "tar"
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith((".warc", ".wet", ".arc")):
        return "warc"
    if suffix == ".parquet":
        return "parquet"
    if suffix in (".html", ".htm", ".xhtml"):
        return "html"
    if suffix in CODE_SUFFIXES:
        return "code"
    if suffix in TEXT_SUFFIXES:
        return "text"
    return None


def list_units(inputs: list[str]) -> list[Unit]:
    """Every unit of every input, in order (folders sorted); raises for a missing path."""
    units: list[Unit] = []
    for spec in inputs:
        if spec == "stdlib":
            root = stdlib_root()
            files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
            units += [Unit("stdlib", str(p), p.stat().st_size) for p in files]
        elif spec.startswith("hf:"):
            units.append(Unit("hf", spec[3:]))
        elif (path := Path(spec)).is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
            units += [Unit(file_kind(p) or "unsupported", str(p), p.stat().st_size) for p in files]
        elif path.is_file():
            units.append(Unit(file_kind(path) or "text", str(path), path.stat().st_size))
        else:
            raise LmforgeError(
                f"input {spec} does not exist: pass a file, a folder, stdlib or hf:NAME"
            )
    return units


def plan_shards(units: list[Unit], shard_bytes: int) -> list[list[Unit]]:
    """Consecutive units grouped into shards of about `shard_bytes` (a big file is its own)."""
    shards: list[list[Unit]] = []
    current: list[Unit] = []
    size = 0
    for unit in units:
        if current and (size + unit.size > shard_bytes or unit.kind == "hf"):
            shards.append(current)
            current, size = [], 0
        current.append(unit)
        size += unit.size
    if current:
        shards.append(current)
    return shards


def read_shard(units: list[Unit], cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    """Documents of the units in order; every skip is a reason in `stats`."""
    for unit in units:
        stats.count("files")
        try:
            for doc in READERS[unit.kind](unit, cfg, stats):
                stats.docs_in += 1
                if not doc.text.strip():
                    stats.remove("empty", doc.id)
                    continue
                size = len(doc.text.encode("utf-8", errors="surrogatepass"))
                if size > cfg.max_doc_bytes:
                    stats.remove("too_large", doc.id, doc.text)
                    continue
                stats.docs_out += 1
                stats.bytes_in += size
                stats.bytes_out += size
                yield doc
        except TruncatedFile:
            stats.remove("truncated_file", unit.path)
        except CorruptFile as e:
            stats.remove("corrupt_file", unit.path, str(e))
        except (OSError, ValueError, LmforgeError) as e:
            stats.remove("unreadable_file", unit.path, f"{type(e).__name__}: {e}")


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
        for line in read_lines(unit.path):
            pieces.append(line)
    except TruncatedFile:
        stats.remove("truncated_file", unit.path)
    return b"\n".join(pieces)


def _text(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    text = _decode(_whole(unit, stats), unit, stats)
    if not text:
        return
    if not cfg.txt_chunk_bytes:
        yield Document(unit.path, text, {"format": "text"})
        return
    chunk: list[str] = []
    size = index = 0
    for line in text.splitlines(keepends=True):
        chunk.append(line)
        size += len(line)
        if size >= cfg.txt_chunk_bytes:
            yield Document(f"{unit.path}#{index}", "".join(chunk))
            chunk, size, index = [], 0, index + 1
    if chunk:
        yield Document(f"{unit.path}#{index}", "".join(chunk))


def _code(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    text = _decode(read_all(unit.path), unit, stats)
    if text is not None:
        lang = Path(strip_compression(unit.path)).suffix.lstrip(".")
        yield Document(unit.path, text, {"format": "code", "lang": lang})


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
    yield Document(unit.path, html, {"format": "html", "encoding": encoding})


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
        doc = _record(obj, where, cfg) if isinstance(obj, dict) else None
        if doc is None:
            stats.remove("no_text_field", where, line[:200].decode("utf-8", "replace"))
            continue
        yield doc


def _parquet(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise LmforgeError("reading Parquet needs pyarrow: pip install 'lmforge[parquet]'") from e
    file = pq.ParquetFile(unit.path)
    row = 0
    for batch in file.iter_batches(batch_size=1024):
        for obj in batch.to_pylist():
            row += 1
            doc = _record(obj, f"{unit.path}:{row}", cfg)
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
    from lmforge.data.documents import ReadStats
    from lmforge.data.webdataset import tar_documents

    counts = ReadStats()
    try:
        for doc_id, text, meta in tar_documents(Path(unit.path), counts):
            yield Document(doc_id, text, meta)
    finally:
        for _ in range(counts.skipped_not_utf8):
            stats.remove("not_utf8", unit.path)


def _hf(unit: Unit, cfg: ReadConfig, stats: StepStats) -> Iterator[Document]:
    try:
        import datasets
    except ImportError as e:
        raise LmforgeError(
            f"hf:{unit.path} needs the Hugging Face `datasets` package: pip install datasets"
        ) from e
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
