"""Token shards on disk: `NAME.bin` (flat token ids) + `NAME.idx` (document starts) + `meta.json`.

Ids are little-endian uint16 when the vocabulary fits in 65536, else uint32. Shards are written
streaming through temporary names (removed again when a write fails: a full disk is one line)
and read back as memory maps, never loaded whole. `meta.json`, written last, marks a folder
complete.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lmforge.atomic import disk_full_is_an_error, write_json
from lmforge.errors import LmforgeError

META_FILE = "meta.json"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


@dataclass
class ShardMeta:
    dtype: str
    vocab_size: int
    tokenizer_fingerprint: str
    shards: dict[str, dict[str, int]]  # name -> {"tokens": N, "documents": D}

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards.values())


def write_shard(
    directory: str | Path, name: str, documents: Iterable[list[int]], vocab_size: int
) -> dict[str, int]:
    """Append each document's ids to `NAME.bin`, its start offset to `NAME.idx`; returns counts."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(vocab_size)
    bin_tmp, idx_tmp = directory / f"{name}.bin.tmp", directory / f"{name}.idx.tmp"
    starts: list[int] = []
    n_tokens = 0
    fix = "free space on that disk, then run the same command again"
    try:
        with disk_full_is_an_error("token shard", directory / f"{name}.bin", fix):
            with open(bin_tmp, "wb") as f:
                for ids in documents:
                    starts.append(n_tokens)
                    f.write(np.asarray(ids, dtype=dtype).tobytes())
                    n_tokens += len(ids)
            np.asarray(starts, dtype="<i8").tofile(idx_tmp)
    except BaseException:
        bin_tmp.unlink(missing_ok=True)
        idx_tmp.unlink(missing_ok=True)
        raise
    os.replace(bin_tmp, directory / f"{name}.bin")
    os.replace(idx_tmp, directory / f"{name}.idx")
    return {"tokens": n_tokens, "documents": len(starts)}


def write_meta(directory: str | Path, meta: ShardMeta) -> None:
    write_json(Path(directory) / META_FILE, asdict(meta))


def read_meta(directory: str | Path) -> ShardMeta:
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise LmforgeError(
            f"{directory} is not a token shard folder (no {META_FILE}): "
            "create one with `lmforge tokenize`"
        )
    return ShardMeta(**json.loads(path.read_text()))


def load_tokens(directory: str | Path, name: str) -> np.memmap:
    """The ids of shard `name` as a read-only memory map."""
    meta = read_meta(directory)
    if name not in meta.shards:
        raise LmforgeError(
            f"{directory} has no shard {name!r} (it has {sorted(meta.shards)}): "
            "tokenize that split first"
        )
    path = Path(directory) / f"{name}.bin"
    if meta.shards[name]["tokens"] == 0:
        return np.zeros(0, dtype=meta.dtype)  # np.memmap refuses empty files
    return np.memmap(path, dtype=np.dtype(meta.dtype), mode="r")


def load_doc_starts(directory: str | Path, name: str) -> np.ndarray:
    return np.fromfile(Path(directory) / f"{name}.idx", dtype="<i8")
