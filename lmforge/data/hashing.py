"""Vectorized text hashing: words and word n-grams of many texts as 64-bit hashes, in numpy.

Shared by near-duplicate detection (`minhash`) and the quality classifier (`classifier`). A batch
of texts is encoded once into one byte array; every later step is a whole-array numpy operation,
so no Python code runs per word.

- A **word** is a maximal run of bytes above 0x20 in the UTF-8 text: ASCII whitespace and control
  characters separate words (non-ASCII spaces such as U+00A0 do not). With `lowercase`, ASCII
  letters are lowercased (non-ASCII letters are left as they are).
- A word's hash is a polynomial hash of its bytes modulo 2^64, finished with the MurmurHash3
  64-bit finalizer (`fmix64`), so it depends only on the word, not on where it occurs.
- An **n-gram** hash combines n consecutive word hashes of one text with fixed odd multipliers,
  then `fmix64`. N-grams never cross texts.

    buf, starts = encode(texts)                        # bytes and per-text offsets
    words, word_offsets = word_hashes(buf, starts)     # per-text slices of `words`
    grams, gram_offsets = ngram_hashes(words, word_offsets, n=5)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_U64 = np.uint64
_BASE = _U64(0x9E3779B97F4A7C15)  # odd, so invertible modulo 2^64
_BASE_INV = _U64(pow(int(_BASE), -1, 1 << 64))
_SLICE_BYTES = 1 << 22
_powers: np.ndarray = np.ones(1, dtype=_U64)
_inverse_powers: np.ndarray = np.ones(1, dtype=_U64)


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: a bijection that spreads every input bit over the output."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> _U64(33))
        h *= _U64(0xFF51AFD7ED558CCD)
        h ^= h >> _U64(33)
        h *= _U64(0xC4CEB9FE1A85EC53)
        h ^= h >> _U64(33)
    return h


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer (uint32 in, uint32 out)."""
    u32 = np.uint32
    with np.errstate(over="ignore"):
        h = h ^ (h >> u32(16))
        h *= u32(0x85EBCA6B)
        h ^= h >> u32(13)
        h *= u32(0xC2B2AE35)
        h ^= h >> u32(16)
    return h


def encode(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The texts' UTF-8 bytes joined by newlines, and the byte offset where each text starts.

    `starts` has one entry per text plus the total length, so text i is
    `buf[starts[i] : starts[i + 1] - 1]` (the newline after it is a separator).
    """
    encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
    starts = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)) + 1, out=starts[1:])
    buf = np.frombuffer(b"\n".join(encoded) + b"\n", dtype=np.uint8) if encoded else _EMPTY_BYTES
    return buf, starts


_EMPTY_BYTES = np.zeros(0, dtype=np.uint8)


def word_hashes(
    buf: np.ndarray, starts: np.ndarray, lowercase: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of the words of each text: (uint64 hashes, per-text offsets into them).

    `buf` and `starts` come from `encode`; the words of text i are
    `hashes[offsets[i] : offsets[i + 1]]`. Buffers over a few MB are hashed in slices cut after a
    separator byte, so memory stays bounded (a word longer than a slice is cut in pieces).
    """
    hashes, word_starts = [], []
    lo = 0
    while lo < len(buf):
        hi = min(lo + _SLICE_BYTES, len(buf))
        if hi < len(buf):
            separators = np.flatnonzero(buf[hi - _SLICE_BYTES // 4 : hi] <= 32)
            if len(separators):
                hi = hi - _SLICE_BYTES // 4 + int(separators[-1]) + 1
        h, w = _slice_word_hashes(buf[lo:hi], lowercase)
        hashes.append(h)
        word_starts.append(w + lo)
        lo = hi
    if not hashes:
        return np.zeros(0, dtype=_U64), np.zeros(len(starts), dtype=np.int64)
    return np.concatenate(hashes), np.searchsorted(np.concatenate(word_starts), starts)


def _slice_word_hashes(buf: np.ndarray, lowercase: bool) -> tuple[np.ndarray, np.ndarray]:
    """Word hashes and word start offsets of one slice of bytes."""
    n = len(buf)
    if lowercase:
        upper = (buf >= 65) & (buf <= 90)
        buf = buf + (upper.view(np.uint8) << np.uint8(5))
    in_word = buf > 32
    edges = np.flatnonzero(in_word[1:] != in_word[:-1]) + 1
    if in_word[0]:
        edges = np.concatenate(([0], edges))
    if in_word[-1]:
        edges = np.concatenate((edges, [n]))
    word_start, word_end = edges[0::2], edges[1::2]
    powers, inverse = _power_tables(n)
    with np.errstate(over="ignore"):
        prefix = np.cumsum(buf.astype(_U64) * powers)
        total = prefix[word_end - 1]
        before = prefix[np.maximum(word_start - 1, 0)]
        before[word_start == 0] = 0
        return fmix64((total - before) * inverse[word_start]), word_start


def ngram_hashes(
    words: np.ndarray, offsets: np.ndarray, n: int, short: str = "whole"
) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of the n-grams of consecutive words of each text: (uint64 hashes, per-text offsets).

    A text with fewer than n words (but at least one) gives one n-gram of all its words when
    `short="whole"` and none when `short="drop"`; a text without words gives none.
    """
    if n < 1:
        raise ValueError(f"n-gram length must be at least 1, got {n}")
    if short not in ("whole", "drop"):
        raise ValueError(f"short must be 'whole' or 'drop', got {short!r}")
    counts = np.diff(offsets)
    n_texts = len(counts)
    # Lay the words out with n - 1 zero slots after every text, so sums of n shifted copies never
    # mix two texts and a short text's sum covers just its own words.
    padded_start = offsets[:-1] + (n - 1) * np.arange(n_texts, dtype=np.int64)
    padded = np.zeros(len(words) + (n - 1) * n_texts + n, dtype=_U64)
    padded[_ranges(padded_start, counts)] = words
    length = len(padded) - n + 1
    with np.errstate(over="ignore"):
        acc = padded[:length] * _GRAM_MULTIPLIERS[0]
        for k in range(1, n):
            acc += padded[k : k + length] * _GRAM_MULTIPLIERS[k]
    per_text = np.maximum(counts - n + 1, 0)
    if short == "whole":
        per_text[(counts > 0) & (counts < n)] = 1
    grams = fmix64(acc[_ranges(padded_start, per_text)] ^ _U64(n))
    gram_offsets = np.zeros(n_texts + 1, dtype=np.int64)
    np.cumsum(per_text, out=gram_offsets[1:])
    return grams, gram_offsets


def segment_ids(offsets: np.ndarray) -> np.ndarray:
    """For per-text offsets, the text index of every element (int64)."""
    return np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for each (s, l), without a Python loop."""
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    shift = np.repeat(starts - (ends - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


def _power_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """BASE^i and BASE^-i modulo 2^64 for i < n (n at most a slice), cached."""
    global _powers, _inverse_powers
    if n > len(_powers):
        size = min(max(n, 2 * len(_powers)), _SLICE_BYTES)
        _powers, _inverse_powers = _geometric(_BASE, size), _geometric(_BASE_INV, size)
    return _powers[:n], _inverse_powers[:n]


def _geometric(base: np.uint64, size: int) -> np.ndarray:
    out = np.full(size, base, dtype=_U64)
    out[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(out, out=out)


_GRAM_MULTIPLIERS = np.random.default_rng(0x5EED).integers(0, 1 << 63, 64, dtype=_U64) * _U64(
    2
) + _U64(1)
