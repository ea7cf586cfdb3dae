"""Encoding documents into token shards, in parallel worker processes.

Each document becomes `<|endoftext|>` followed by its ids, so every document starts after a
separator and generation can be prompted from a document start.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.progress import bar
from lmforge.tokenizer import Tokenizer
from lmforge.tokens.shards import (
    META_FILE,
    ShardMeta,
    token_dtype,
    write_meta,
    write_shard,
)

_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer: Tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def _encode_with_separator(text: str) -> list[int]:
    assert _worker_tokenizer is not None
    return document_ids(_worker_tokenizer, text)


def document_start(tokenizer: Tokenizer, ids: list[int]) -> list[int]:
    """lmforge's one document-start rule: ids made from a text start a document, and a document
    starts with `<|endoftext|>`, as every document in the token shards does, unless the ids
    start with it already (a text that opens with the token's own text).

    Every place that turns text into a model's input applies it: the shards (`document_ids`),
    prompts (`lmforge generate`, `lmforge chat`, the server's text prompts and chat template),
    `lmforge eval`'s requests (lmforge.eval.encoding), and the server's `/tokenize` (through
    which lm-eval's `local-completions` encodes), so a log-likelihood is the same by every route.
    Token ids a client sends are the model's input as they are."""
    eot = tokenizer.eot_id
    if eot is None or ids[:1] == [eot]:
        return list(ids)
    return [eot, *ids]


def document_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """`<|endoftext|>` then the text's ids: how every document (and prompt) starts."""
    return document_start(tokenizer, tokenizer.encode_ordinary(text))


def encode_texts(
    tokenizer: Tokenizer,
    texts: Iterable[str],
    workers: int | None = None,
    desc: str = "encode",
    total: int | None = None,
) -> Iterator[list[int]]:
    """Ids for each text, in input order; `workers` processes (default: all cores).

    `total`, the number of texts when known, gives the progress bar its ETA."""
    workers = workers or os.cpu_count() or 1
    progress = bar(desc=desc, unit="doc", total=total)
    if workers == 1:
        for text in texts:
            yield document_ids(tokenizer, text)
            progress.update()
    else:
        ctx = mp.get_context("spawn")
        with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer,)) as pool:
            for ids in pool.imap(_encode_with_separator, texts, chunksize=16):
                yield ids
                progress.update()
    progress.close()


def tokenize_splits(
    tokenizer: Tokenizer,
    splits: dict[str, Iterable[str]],
    out_dir: str | Path,
    workers: int | None = None,
    totals: dict[str, int] | None = None,
) -> ShardMeta:
    """Write one shard per named split of texts into `out_dir`, a copy of the tokenizer into
    `out_dir/tokenizer`, and last `meta.json`, which marks the folder complete.

    A split without documents is an error: its files are removed and no `meta.json` is written.
    An earlier `meta.json` in `out_dir` is removed first: until the new one is written, the
    folder is incomplete, never new shards under old counts.
    """
    (Path(out_dir) / META_FILE).unlink(missing_ok=True)
    tokenizer.save(Path(out_dir) / "tokenizer")
    counts = {
        name: write_shard(
            out_dir,
            name,
            encode_texts(
                tokenizer, texts, workers, desc=f"encode {name}", total=(totals or {}).get(name)
            ),
            tokenizer.vocab_size,
        )
        for name, texts in splits.items()
    }
    empty = [name for name, c in counts.items() if c["documents"] == 0]
    if empty:
        for name in empty:
            for suffix in (".bin", ".idx"):
                (Path(out_dir) / f"{name}{suffix}").unlink(missing_ok=True)
        raise LmforgeError(
            f"the {' and '.join(empty)} split(s) hold no documents: nothing to write to {out_dir}"
        )
    meta = ShardMeta(
        dtype=token_dtype(tokenizer.vocab_size).str,
        vocab_size=tokenizer.vocab_size,
        tokenizer_fingerprint=tokenizer.fingerprint(),
        shards=counts,
    )
    write_meta(out_dir, meta)
    return meta
