"""Corpus preparation: documents → cleaning → train/val split → BPE tokenizer → token shards.

Each stage writes into its own folder of a preparation directory and is skipped when its output
is already there, so an interrupted run resumes where it stopped:

    data/{train,val}.jsonl, data/stats.json    documents after dedup, split by id hash
    tokenizer/                                 the trained tokenizer
    tokens/{train,val}.{bin,idx}, meta.json    token shards
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.atomic import write_json
from lmforge.config_ranges import FRACTION, NON_NEGATIVE, Range, ranged
from lmforge.data import (
    DOC_SEPARATOR,
    Document,
    is_validation,
    read_documents,
    read_jsonl,
    split_score,
    stdlib_documents,
    write_jsonl,
)
from lmforge.errors import LmforgeError
from lmforge.progress import bar
from lmforge.tokenizer import PATTERNS, Tokenizer, train_bpe, train_bpe_files
from lmforge.tokens import ShardMeta, read_meta
from lmforge.tokens.encode import tokenize_splits

QUALITY_PROFILES = ("auto", "code", "prose", "off")


@dataclass
class DataConfig:
    path: str = ""  # empty: the Python standard library's source
    val_fraction: float = ranged(0.01, FRACTION)
    workers: int = ranged(0, NON_NEGATIVE)  # 0: all cores
    # The quality rules: auto picks code or prose rules per document, code/prose apply one set
    # to every document, off skips them (lmforge.data.pipeline.corpus).
    quality_profile: str = "auto"
    # A .txt line that is exactly this separates documents ("": none); it becomes the
    # tokenizer's end-of-text token, never literal text (lmforge.data.documents.split_text).
    doc_separator: str = DOC_SEPARATOR

    def __post_init__(self) -> None:  # checked when the config is built, before any work
        if self.quality_profile not in QUALITY_PROFILES:
            raise LmforgeError(
                f"data.quality_profile {self.quality_profile!r} is unknown: "
                f"use {', '.join(QUALITY_PROFILES)}"
            )


@dataclass
class TokenizerConfig:
    vocab_size: int = ranged(4096, Range(256))  # the 256 byte tokens come first
    pattern: str = "gpt2"
    # <|endoftext|> separates documents; the ChatML pair marks chat turns
    # (tokenizer/chat_template.py)
    special_tokens: list[str] = field(
        default_factory=lambda: ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    )
    train_bytes: int = ranged(0, NON_NEGATIVE)  # 0: all training documents; else the first N


@dataclass
class Prepared:
    root: Path
    stats: dict

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"

    @property
    def shard_dir(self) -> Path:
        return self.root / "tokens"


def prepare_corpus(data: DataConfig, tok: TokenizerConfig, root: str | Path) -> Prepared:
    """Run (or reuse) every preparation stage under `root`."""
    root = Path(root)
    stats = prepare_documents(data, root / "data")
    tokenizer = prepare_tokenizer(
        tok, root / "data" / "train.jsonl", root / "tokenizer", data.workers or None
    )
    meta = prepare_shards(
        tokenizer, root / "data", root / "tokens", data.workers or None, stats["documents"]
    )
    stats["tokens"] = {name: s["tokens"] for name, s in meta.shards.items()}
    return Prepared(root, stats)


def prepare_documents(data: DataConfig, out: Path) -> dict:
    """Read, clean (data pipeline) and split documents into `out/{train,val}.jsonl`; stats."""
    stats_path = out / "stats.json"
    if stats_path.exists():
        print(f"documents: reusing {out}")
        return json.loads(stats_path.read_text())
    from lmforge.data.pipeline.corpus import clean_corpus, drop_shards

    cleaned, summary = clean_corpus(
        data.path, data.workers, out / "pipeline", data.quality_profile, data.doc_separator
    )
    docs = bar(cleaned, desc="split", unit="doc")
    val: list[Document] = []
    first_train: list[Document] = []  # the lowest-scoring train doc, in case val ends up empty

    def train_docs() -> Iterator[Document]:
        for doc in docs:
            if is_validation(doc.id, data.val_fraction):
                val.append(doc)
                continue
            if not first_train or split_score(doc.id) < split_score(first_train[0].id):
                first_train[:] = [doc]
            yield doc

    n_train = write_jsonl(out / "train.jsonl", train_docs())
    if not val and n_train > 1:
        moved = first_train[0]
        val.append(moved)
        n_train = write_jsonl(
            out / "train.jsonl", (d for d in read_jsonl(out / "train.jsonl") if d.id != moved.id)
        )
    if summary["documents_in"] == 0:
        where = data.path or "the standard library"
        raise LmforgeError(f"no readable text found in {where}: pass UTF-8 .txt or .jsonl data")
    if n_train == 0:
        removed = sum(summary["quality_removed"].values())
        hint = (
            f" (the quality rules removed {removed}: see {out / 'pipeline' / 'summary.md'}, "
            "or --set data.quality_profile=off)"
            if removed
            else ""
        )
        raise LmforgeError(
            f"only {len(val)} document(s) left after cleaning{hint}: "
            "a validation split needs at least two; add data"
        )
    write_jsonl(out / "val.jsonl", val)
    stats = {
        "source": data.path or "python-stdlib",
        **summary,
        "documents": {"train": n_train, "val": len(val)},
    }
    write_json(stats_path, stats)
    drop_shards(out / "pipeline")
    judged = ", ".join(f"{n} by {name} rules" for name, n in summary["quality_profiles"].items())
    removed = sum(summary["quality_removed"].values())
    quality = f"quality rules removed {removed} of {judged}" if judged else "quality rules off"
    print(
        f"documents: {summary['documents_in']} read, {summary['duplicates_removed']} duplicates "
        f"and {summary['near_duplicates_removed']} near-duplicates removed, {quality}, "
        f"{n_train} train / {len(val)} val"
    )
    return stats


def prepare_tokenizer(
    tok: TokenizerConfig, train_jsonl: Path, out: Path, workers: int | None = None
) -> Tokenizer:
    if out.exists():
        print(f"tokenizer: reusing {out}")
        return Tokenizer.load(out)
    tokenizer = train_tokenizer([str(train_jsonl)], tok, out, workers)
    print(f"tokenizer: vocab {tokenizer.vocab_size} saved to {out}")
    return tokenizer


def prepare_shards(
    tokenizer: Tokenizer,
    docs_dir: Path,
    out: Path,
    workers: int | None,
    doc_counts: dict[str, int] | None = None,
) -> ShardMeta:
    if (out / "meta.json").exists():
        meta = read_meta(out)
        if meta.tokenizer_fingerprint == tokenizer.fingerprint():
            print(f"tokens: reusing {out}")
            return meta
    splits = {
        name: (doc.text for doc in read_jsonl(docs_dir / f"{name}.jsonl"))
        for name in ("train", "val")
    }
    meta = tokenize_splits(tokenizer, splits, out, workers, doc_counts)
    print(f"tokens: {meta.shards['train']['tokens']} train / {meta.shards['val']['tokens']} val")
    return meta


def _first_bytes(texts: Iterator[str], limit: int) -> Iterator[str]:
    total = 0
    for text in texts:
        if total >= limit:
            return
        total += len(text.encode("utf-8"))
        yield text


def read_inputs(paths: list[str], separator: str = DOC_SEPARATOR) -> Iterator[Document]:
    """Documents from every path in turn (the built-in corpus when `paths` is empty); a .txt is
    split at `separator` lines."""
    if not paths:
        yield from stdlib_documents()
    for path in paths:
        yield from read_documents(path, separator=separator)


def train_tokenizer(
    paths: list[str],
    tok: TokenizerConfig,
    out: str | Path,
    workers: int | None = None,
    invalid_utf8: str = "replace",
    doc_separator: str = DOC_SEPARATOR,
) -> Tokenizer:
    """`lmforge tokenizer train`: a BPE tokenizer trained on the files at `paths`, streamed from
    disk by `workers` processes (default: all cores), or on the built-in corpus without paths.

    A `doc_separator` that is a special token is never merged into, so the files stream as they
    are; any other separator is dropped by reading the files as documents (`read_inputs`)."""
    if tok.pattern not in PATTERNS:
        raise LmforgeError(
            f"unknown tokenizer pattern {tok.pattern!r}: use one of {sorted(PATTERNS)}"
        )
    pattern = PATTERNS[tok.pattern]
    if paths and doc_separator and doc_separator not in tok.special_tokens:
        texts = (doc.text for doc in read_inputs(paths, doc_separator))
        if tok.train_bytes:
            texts = _first_bytes(texts, tok.train_bytes)
        tokenizer = train_bpe(texts, tok.vocab_size, tok.special_tokens, pattern, workers=workers)
    elif paths:
        tokenizer = train_bpe_files(
            paths,
            tok.vocab_size,
            tok.special_tokens,
            pattern,
            workers=workers,
            max_bytes=tok.train_bytes,
            invalid_utf8=invalid_utf8,  # type: ignore[arg-type]
        )
    else:
        texts = (doc.text for doc in read_inputs(paths))
        if tok.train_bytes:
            texts = _first_bytes(texts, tok.train_bytes)
        tokenizer = train_bpe(texts, tok.vocab_size, tok.special_tokens, pattern, workers=workers)
    tokenizer.save(out)
    return tokenizer


def tokenize_inputs(
    tokenizer_dir: str | Path, paths: list[str], out: str | Path, data: DataConfig
) -> ShardMeta:
    """`lmforge tokenize`: train/val shards of the documents at `paths`, split by id hash.

    The inputs are read twice: once to count each split, so that input without text is an error
    before anything is written, then to encode. As in `prepare_documents`, when the hash puts no
    document in the validation split, the train document with the lowest split score moves there.
    A single document, or `val_fraction` 0, gives a train shard alone: training on such a folder
    stops with a one-line error (it validates on the val shard), other uses of it work.
    """
    tokenizer = Tokenizer.load(tokenizer_dir)
    n_train = n_val = 0
    lowest: tuple[float, str] | None = None  # (split score, id) of the lowest train document
    for doc in read_inputs(paths, data.doc_separator):
        if is_validation(doc.id, data.val_fraction):
            n_val += 1
            continue
        n_train += 1
        if lowest is None or split_score(doc.id) < lowest[0]:
            lowest = (split_score(doc.id), doc.id)
    where = ", ".join(paths) or "the standard library"
    if n_train + n_val == 0:
        raise LmforgeError(
            f"{where} holds no document with text: pass UTF-8 .txt, .jsonl or .tar files with text"
        )
    if data.val_fraction == 0 or n_train + n_val == 1:
        return _tokenize_train_only(tokenizer, paths, out, data, n_train + n_val)
    if n_train == 0:
        raise LmforgeError(
            f"--val-fraction {data.val_fraction} leaves no document to train on: lower it"
        )
    moved = lowest[1] if n_val == 0 and lowest is not None else None
    val_texts: list[str] = []

    def train_texts() -> Iterator[str]:
        pending = moved
        for doc in read_inputs(paths, data.doc_separator):
            if is_validation(doc.id, data.val_fraction):
                val_texts.append(doc.text)
            elif doc.id == pending:
                val_texts.append(doc.text)
                pending = None
            else:
                yield doc.text

    # The train shard is written first; the (small) validation texts are collected on the way.
    splits = {"train": train_texts(), "val": iter(val_texts)}
    totals = {"train": n_train - (moved is not None), "val": n_val + (moved is not None)}
    return tokenize_splits(tokenizer, splits, out, data.workers or None, totals)


def _tokenize_train_only(
    tokenizer: Tokenizer, paths: list[str], out: str | Path, data: DataConfig, total: int
) -> ShardMeta:
    """Every document into the train shard: no validation split is written."""
    texts = (doc.text for doc in read_inputs(paths, data.doc_separator))
    why = "--val-fraction 0" if data.val_fraction == 0 else "one document"
    print(f"tokenize: {why}, so a train shard alone (no val shard to validate on)")
    return tokenize_splits(tokenizer, {"train": texts}, out, data.workers or None, {"train": total})
