"""The pipeline's readers: input paths to shards of documents, bad input counted and skipped.

Inputs are files, folders (walked for known formats), `stdlib` (the interpreter's standard
library source) or `hf:NAME` (a Hugging Face dataset, streamed; needs `datasets` and a network).
Formats are known by name: .txt/.md (split at `<|endoftext|>` lines, `read.doc_separator`,
and cut into ~32 KB documents, like `read_documents`), source code (one document per file),
JSONL (.gz/.zst too), Parquet, WARC/WET, HTML, WebDataset tar.
Anything damaged — a truncated or corrupt stream, a bad line, binary or non-UTF-8 bytes, an
empty or oversized document — becomes a reason in the `read` step's stats, never an exception,
and the documents read before the damage are kept.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

from lmforge.data.documents import Document, source_name, stdlib_root
from lmforge.data.formats import READERS
from lmforge.data.read_units import ReadConfig, Unit
from lmforge.data.stats import StepStats
from lmforge.data.streams import CorruptFile, TruncatedFile, strip_compression
from lmforge.errors import LmforgeError

CODE_SUFFIXES = frozenset(
    {".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go", ".java", ".js", ".ts"}
    | {".jsx", ".tsx", ".rb", ".php", ".cs", ".swift", ".kt", ".scala", ".sh", ".lua", ".sql"}
)
TEXT_SUFFIXES = frozenset((".txt", ".md", ".rst", ".text"))


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
            if importlib.util.find_spec("datasets") is None:
                raise LmforgeError(
                    f"{spec} needs the Hugging Face `datasets` package: pip install datasets"
                )
            units.append(Unit("hf", spec[3:]))
        elif (path := Path(spec)).is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
            units += [
                Unit(file_kind(p) or "unsupported", str(p), p.stat().st_size, source_name(path, p))
                for p in files
            ]
        elif path.is_file():
            kind = file_kind(path) or "text"
            units.append(Unit(kind, str(path), path.stat().st_size, source_name(path, path)))
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
    """Documents of the units in order; every skip is a reason in `stats`.

    `docs_in` counts every item read: each document a reader yields, and each file, line or
    record it skips (a non-UTF-8 file, a bad JSON line), so `docs_in = docs_out + removed`.
    """
    for unit in units:
        stats.count("files")
        removed_before = sum(stats.removed.values())
        yielded_removed = 0  # removals of documents already counted in docs_in
        try:
            for doc in READERS[unit.kind](unit, cfg, stats):
                stats.docs_in += 1
                if not doc.text.strip():
                    stats.remove("empty", doc.id)
                    yielded_removed += 1
                    continue
                size = len(doc.text.encode("utf-8", errors="surrogatepass"))
                if size > cfg.max_doc_bytes:
                    stats.remove("too_large", doc.id, doc.text)
                    yielded_removed += 1
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
        stats.docs_in += sum(stats.removed.values()) - removed_before - yielded_removed
