"""Byte-level BPE training: count pre-tokens (in parallel, streaming), then learn the merges.

`train_bpe` takes texts in memory; `train_bpe_files` streams files from disk, so a corpus larger
than memory can be trained on. Both give byte-identical results whatever the number of workers.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.progress import bar
from lmforge.tokenizer.bpe import utf8
from lmforge.tokenizer.count import count_pretokens
from lmforge.tokenizer.merge import learn_merges
from lmforge.tokenizer.pretokenize import GPT2_PATTERN, PATTERNS
from lmforge.tokenizer.sources import (
    CHUNK_BYTES,
    Chunk,
    InputStats,
    InvalidUtf8,
    file_chunks,
    input_files,
    text_chunks,
)
from lmforge.tokenizer.tokenizer import Tokenizer
from lmforge.tokenizer.workers import default_workers

EOT = "<|endoftext|>"


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: Sequence[str] = (EOT,),
    pattern: str = GPT2_PATTERN,
    *,
    workers: int | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Tokenizer:
    """Train a tokenizer with `vocab_size` ids: 256 bytes, then merges, then `special_tokens`.

    Each text is pre-tokenized on its own (`pattern`: a regex, or "gpt2"/"gpt4"); special tokens
    split it further and are never merged into. The most frequent adjacent pair is merged first;
    ties go to the greatest `(bytes_a, bytes_b)`. Stops early when no pair is left, with a
    warning on stderr (no text at all gives the 256 bytes and the special tokens). `workers`
    processes count pre-tokens (default: all cores; small inputs stay in this process).
    """
    specials, pattern = _check_args(vocab_size, special_tokens, pattern)
    chunks = text_chunks(texts, specials, chunk_bytes)
    return _train(chunks, vocab_size, specials, pattern, workers, None, "the input")


def train_bpe_files(
    paths: Sequence[str | Path],
    vocab_size: int,
    special_tokens: Sequence[str] = (EOT,),
    pattern: str = GPT2_PATTERN,
    *,
    workers: int | None = None,
    max_bytes: int = 0,
    invalid_utf8: InvalidUtf8 = "replace",
    chunk_bytes: int = CHUNK_BYTES,
    stats: InputStats | None = None,
) -> Tokenizer:
    """`train_bpe` on files read from disk a chunk at a time: .txt files (each one text) and
    .jsonl files (each line's 'text' field one text), or folders of them.

    `max_bytes` (0: all) stops reading after that many bytes (JSONL: at the end of that line).
    Bytes that are not UTF-8 are replaced by U+FFFD (`invalid_utf8="skip"`: dropped), counted in
    `stats`, and reported once. Files without any text are an error.
    """
    specials, pattern = _check_args(vocab_size, special_tokens, pattern)
    stats = stats if stats is not None else InputStats()
    files = list(input_files(paths))
    total = sum(f.stat().st_size for f in files)
    if max_bytes:
        total = min(total, max_bytes)
    chunks = file_chunks(files, specials, chunk_bytes, invalid_utf8, stats, max_bytes)
    names = [str(p) for p in paths]
    source = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    tokenizer = _train(chunks, vocab_size, specials, pattern, workers, total, source, True)
    if stats.invalid_utf8:
        action = "replaced by U+FFFD" if invalid_utf8 == "replace" else "skipped"
        print(
            f"warning: {stats.invalid_utf8} invalid UTF-8 byte sequence(s) {action} in "
            f"{len(stats.invalid_files)} file(s), first {stats.invalid_files[0]}",
            file=sys.stderr,
        )
    return tokenizer


def _check_args(
    vocab_size: int, special_tokens: Sequence[str], pattern: str
) -> tuple[list[str], str]:
    if isinstance(special_tokens, str):
        raise LmforgeError("special_tokens is one string; pass a list of special tokens")
    specials = list(dict.fromkeys(special_tokens))
    if any(not isinstance(s, str) or not s for s in specials):
        raise LmforgeError("a special token is empty; pass non-empty strings as special tokens")
    if vocab_size < 256 + len(specials):
        raise LmforgeError(
            f"vocab_size {vocab_size} is below 256 bytes + {len(specials)} special tokens; "
            f"pass vocab_size >= {256 + len(specials)}"
        )
    return specials, PATTERNS.get(pattern, pattern)


def _train(
    chunks: Iterable[Chunk],
    vocab_size: int,
    specials: list[str],
    pattern: str,
    workers: int | None,
    total: int | None,
    source: str,
    need_text: bool = False,
) -> Tokenizer:
    workers = default_workers() if workers is None or workers <= 0 else workers
    counts = count_pretokens(chunks, specials, pattern, workers, total)
    if need_text and not counts:
        raise LmforgeError(f"no text to train the tokenizer on in {source}: pass files with text")
    words, freqs = _words(counts)
    n_merges = vocab_size - len(specials) - 256
    with bar(total=n_merges, desc="merges", unit="merge") as progress:
        merges = learn_merges(words, freqs, n_merges, progress)
    if len(merges) < n_merges:
        reached = 256 + len(merges) + len(specials)
        print(
            f"warning: the tokenizer's vocabulary reached {reached} of the requested "
            f"{vocab_size} tokens: {source} holds no more pairs to merge; add text or lower "
            "the vocabulary size",
            file=sys.stderr,
        )
    ranks = {bytes([b]): b for b in range(256)}
    for a, b in merges:
        ranks[a + b] = len(ranks)
    special_ids = {s: len(ranks) + i for i, s in enumerate(specials)}
    return Tokenizer(ranks, special_ids, pattern, merges=merges)


def _words(counts: Counter[str]) -> tuple[list[bytes], list[int]]:
    """Pre-tokens as bytes with their counts, sorted (so merging never sees counting order);
    single bytes hold no pair and are left out."""
    by_bytes: dict[bytes, int] = {}
    for text, n in counts.items():
        word = utf8(text)
        if len(word) > 1:
            by_bytes[word] = by_bytes.get(word, 0) + n
    words = sorted(by_bytes)
    return words, [by_bytes[w] for w in words]
