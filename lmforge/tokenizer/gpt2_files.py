"""GPT-2's vocabulary format: vocab.json ({token: id}) and merges.txt ("A B" per line), both in
GPT-2's byte-to-unicode text; writing them, and reading them with a check that they agree.

The same checks serve tokenizer.json, whose BPE model holds the same two tables.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import regex

from lmforge.errors import LmforgeError
from lmforge.tokenizer.bytes_unicode import bytes_to_text, text_to_bytes

SPECIAL_FORM = regex.compile(r"<\|[^\s]*?\|>")  # how GPT-2 style special tokens look


def vocab_json(ranks: dict[bytes, int], specials: dict[str, int]) -> str:
    vocab = {bytes_to_text(t): r for t, r in ranks.items()}
    for special, i in specials.items():
        vocab.setdefault(special, i)
    return json.dumps(dict(sorted(vocab.items(), key=lambda item: item[1])), ensure_ascii=False)


def merge_lines(merges: Iterable[tuple[bytes, bytes]]) -> list[str]:
    return [f"{bytes_to_text(a)} {bytes_to_text(b)}" for a, b in merges]


def merges_txt(merges: Iterable[tuple[bytes, bytes]]) -> str:
    return "\n".join(["#version: 0.2", *merge_lines(merges)]) + "\n"


def parse_vocab(
    vocab: object, origin: str, specials: dict[str, int] | None
) -> tuple[dict[bytes, int], dict[str, int]]:
    """Ranks and special tokens from a {token: id} object. Without `specials` given, they are
    the `<|...|>` entries, as in GPT-2's published vocab.json."""
    if not isinstance(vocab, dict):
        raise LmforgeError(f"{origin} is not a {{token: id}} object; rewrite or replace it")
    if specials is None:
        specials = {t: i for t, i in vocab.items() if SPECIAL_FORM.fullmatch(t)}
    ranks: dict[bytes, int] = {}
    owner: dict[int, str] = {}
    for text, i in vocab.items():
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise LmforgeError(f"{origin} entry {text!r} has id {i!r}, not an integer >= 0")
        if i in owner and owner[i] != text:
            raise LmforgeError(f"{origin} gives id {i} to both {owner[i]!r} and {text!r}")
        owner[i] = text
        if specials.get(text) == i:
            continue
        try:
            ranks[text_to_bytes(text)] = i
        except KeyError:
            raise LmforgeError(
                f"{origin} entry {text!r} is not GPT-2 byte-mapped text; rewrite it with "
                "lmforge's Tokenizer.save"
            ) from None
    return ranks, dict(specials)


def parse_merges(
    lines: Sequence[str], ranks: dict[bytes, int], origin: str, unit: str = "line"
) -> list[tuple[bytes, bytes]]:
    """Merge pairs from "A B" lines, checked against `ranks`: both parts and their concatenation
    must be tokens, and merged tokens must come in id order (ids are ranks). The first bad line
    raises, named as `origin` `unit` N."""
    merges = []
    previous = -1
    for n, line in enumerate(lines, 1):
        where = f"{origin} {unit} {n}"
        if not line or (n == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        try:
            if len(parts) != 2 or not all(parts):
                raise KeyError(line)
            a, b = text_to_bytes(parts[0]), text_to_bytes(parts[1])
        except KeyError:
            raise LmforgeError(
                f"{where} ({line[:40]!r}) is not a GPT-2 merge 'A B'; fix or delete it"
            ) from None
        for token in (a, b, a + b):
            if token not in ranks:
                raise LmforgeError(
                    f"{where} ({line!r}) needs {bytes_to_text(token)!r}, which the "
                    "vocabulary lacks: vocabulary and merges come from different tokenizers"
                )
        rank = ranks[a + b]
        if rank < previous:
            raise LmforgeError(
                f"{where} ({line!r}) makes id {rank}, below the id {previous} of an "
                "earlier line; lmforge needs merges in id order (ids are ranks)"
            )
        previous = rank
        merges.append((a, b))
    return merges
