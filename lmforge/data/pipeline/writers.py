"""Writing document shards (JSONL, zstd-compressed JSONL, Parquet) atomically, and reading them.

A shard is written under a temporary name and renamed when complete, so a crash never leaves a
half shard under the final name. Parquet stores `meta` as a JSON string column.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from lmforge.data.documents import Document
from lmforge.extras import import_extra

PARQUET_ROWS = 2048


def shard_name(index: int, fmt: str) -> str:
    return f"shard_{index:05d}.{fmt}"


def write_shard(path: str | Path, docs: Iterable[Document], fmt: str) -> int:
    """Write `docs` to `path` in format `fmt`; returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        count = _write_parquet(tmp, docs) if fmt == "parquet" else _write_jsonl(tmp, docs, fmt)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return count


def _write_jsonl(path: Path, docs: Iterable[Document], fmt: str) -> int:
    count = 0
    with open(path, "wb") as raw:
        if fmt == "jsonl.zst":
            zstandard = import_extra("zstandard", "writing jsonl.zst shards", "data")
            stream = zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False)
        else:
            stream = raw
        with io.TextIOWrapper(stream, encoding="utf-8", write_through=False) as f:
            for doc in docs:
                f.write(doc.to_json())
                f.write("\n")
                count += 1
    return count


def _write_parquet(path: Path, docs: Iterable[Document]) -> int:
    pa = import_extra("pyarrow", "writing Parquet shards", "parquet")
    pq = import_extra("pyarrow.parquet", "writing Parquet shards", "parquet")

    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("meta", pa.string())])
    count = 0
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        rows: list[Document] = []
        for doc in docs:
            rows.append(doc)
            if len(rows) == PARQUET_ROWS:
                writer.write_table(_table(rows, schema))
                count, rows = count + len(rows), []
        if rows or count == 0:
            writer.write_table(_table(rows, schema))
            count += len(rows)
    return count


def _table(rows: list[Document], schema):
    import pyarrow as pa

    return pa.table(
        {
            "id": [d.id for d in rows],
            "text": [d.text for d in rows],
            "meta": [json.dumps(d.meta, ensure_ascii=False) for d in rows],
        },
        schema=schema,
    )


def read_shard_file(path: str | Path) -> Iterator[Document]:
    """The documents of a shard this module wrote, in order."""
    path = Path(path)
    if path.name.endswith(".parquet"):
        pq = import_extra("pyarrow.parquet", "reading Parquet shards", "parquet")

        for batch in pq.ParquetFile(path).iter_batches(batch_size=PARQUET_ROWS):
            for row in batch.to_pylist():
                yield Document(row["id"], row["text"], json.loads(row["meta"]))
        return
    with open(path, "rb") as raw:
        if path.name.endswith(".zst"):
            zstandard = import_extra("zstandard", "reading jsonl.zst shards", "data")
            stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        else:
            stream = raw
        for line in io.TextIOWrapper(stream, encoding="utf-8"):
            if line.strip():
                yield Document.from_json(line)


def read_output(folder: str | Path) -> Iterator[Document]:
    """Every document of a pipeline's output folder, shard by shard."""
    for path in sorted(Path(folder).glob("shard_*")):
        if not path.name.endswith(".tmp"):
            yield from read_shard_file(path)
