"""Hugging Face's tokenizer.json for a byte-level BPE: building it, and reading one back.

The file reproduces our ids in the `tokenizers` library: a Split pre-tokenizer with our pattern,
then ByteLevel (no regex of its own, no prefix space); a BPE model with our vocab and merges that
first looks the whole pre-token up (`ignore_merges`, tiktoken's rule); special tokens as added
tokens, which split text before anything else.
"""

from __future__ import annotations

from typing import Any

from lmforge.errors import LmforgeError
from lmforge.tokenizer.bytes_unicode import bytes_to_text
from lmforge.tokenizer.gpt2_files import merge_lines, parse_merges, parse_vocab
from lmforge.tokenizer.parts import HasParts, Parts
from lmforge.tokenizer.pretokenize import GPT2_PATTERN

BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}


def to_json(tokenizer: HasParts) -> dict[str, Any]:
    specials = tokenizer.special_tokens
    vocab = {bytes_to_text(t): i for t, i in tokenizer.mergeable_ranks.items()}
    vocab.update(specials)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": s,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for s, i in sorted(specials.items(), key=lambda item: item[1])
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": tokenizer.pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {**BYTE_LEVEL, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {**BYTE_LEVEL, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": dict(sorted(vocab.items(), key=lambda item: item[1])),
            "merges": merge_lines(tokenizer.merges),
        },
    }


def from_json(obj: Any, origin: str) -> Parts:
    """A tokenizer's parts from a parsed tokenizer.json of a byte-level BPE (ours, GPT-2's,
    Llama 3's)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        raise LmforgeError(f"{origin} has no 'model' object; it is not a tokenizer.json")
    model = obj["model"]
    if model.get("type", "BPE") != "BPE":
        raise LmforgeError(f"{origin} holds a {model.get('type')} model; lmforge reads BPE only")
    if obj.get("normalizer"):
        raise LmforgeError(f"{origin} has a normalizer, which lmforge's byte-level BPE lacks")
    pattern = _pattern(obj.get("pre_tokenizer"), origin)
    added = obj.get("added_tokens") or []
    try:
        specials = {str(t["content"]): int(t["id"]) for t in added}
    except (TypeError, KeyError, ValueError):
        raise LmforgeError(f"{origin} 'added_tokens' entries lack 'content' or 'id'") from None
    if any(not s for s in specials):
        raise LmforgeError(f"{origin} has an empty added token; remove it")
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        vocab = {t: i for t, i in vocab.items() if t not in specials}
    ranks, _ = parse_vocab(vocab, f"{origin} model.vocab", {})
    raw = model.get("merges") or []
    lines = [m if isinstance(m, str) else " ".join(map(str, m)) for m in raw]
    merges = parse_merges(lines, ranks, f"{origin} model.merges", "entry")
    return Parts(ranks, specials, pattern, merges)


def _pattern(pre: Any, origin: str) -> str:
    """The split pattern of a byte-level pre-tokenizer; anything else is refused."""
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) else []
    if isinstance(pre, dict) and pre.get("type") != "Sequence":
        steps = [pre]
    byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
    splits = [s for s in steps if s.get("type") == "Split"]
    if len(byte_level) != 1 or len(splits) + len(byte_level) != len(steps) or len(splits) > 1:
        raise LmforgeError(
            f"{origin} pre_tokenizer is not a byte-level one (ByteLevel, or Split then ByteLevel)"
        )
    if byte_level[0].get("add_prefix_space"):
        raise LmforgeError(f"{origin} adds a prefix space, which tiktoken-style BPE does not")
    if splits:
        if byte_level[0].get("use_regex", True):
            raise LmforgeError(f"{origin} splits twice (Split, then ByteLevel with use_regex)")
        regex = splits[0].get("pattern", {}).get("Regex")
        if not regex or splits[0].get("behavior") != "Isolated" or splits[0].get("invert"):
            raise LmforgeError(f"{origin} Split pre-tokenizer is not an isolating regex split")
        return regex
    if byte_level[0].get("use_regex", True):
        return GPT2_PATTERN
    raise LmforgeError(f"{origin} pre_tokenizer has no split pattern")
