"""Tokenizer folders on disk: GPT-2's vocab.json + merges.txt plus lmforge_tokenizer.json.

A folder holding only GPT-2's published vocab.json + merges.txt loads too. Saving writes a
complete new folder first and swaps it in, so a crash never leaves a half-written tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import regex

from lmforge.errors import LmforgeError
from lmforge.tokenizer.bytes_unicode import bytes_to_text, text_to_bytes
from lmforge.tokenizer.pretokenize import GPT2_PATTERN

if TYPE_CHECKING:
    from lmforge.tokenizer.tokenizer import Tokenizer

VOCAB = "vocab.json"
MERGES = "merges.txt"
META = "lmforge_tokenizer.json"
SPECIAL_FORM = regex.compile(r"<\|[^\s]*?\|>")


def save(tokenizer: Tokenizer, directory: str | Path) -> None:
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise LmforgeError(f"{target} is a file, not a folder; pass a folder path to save into")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the saved folder is an ordinary one
    try:
        _write(tokenizer, tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / target.name)
            os.replace(tmp, target)
            shutil.rmtree(old)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write(tokenizer: Tokenizer, folder: Path) -> None:
    vocab = {bytes_to_text(t): r for t, r in tokenizer.mergeable_ranks.items()}
    for special, i in tokenizer.special_tokens.items():
        vocab.setdefault(special, i)
    vocab = dict(sorted(vocab.items(), key=lambda item: item[1]))
    (folder / VOCAB).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"]
    lines += [f"{bytes_to_text(a)} {bytes_to_text(b)}" for a, b in tokenizer.merges]
    (folder / MERGES).write_text("\n".join(lines) + "\n", encoding="utf-8")
    meta = {"pattern": tokenizer.pattern, "special_tokens": tokenizer.special_tokens}
    (folder / META).write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")


def load(directory: str | Path) -> Tokenizer:
    from lmforge.tokenizer.tokenizer import Tokenizer

    folder = Path(directory)
    if not folder.is_dir():
        raise LmforgeError(f"tokenizer folder {folder} not found; pass a folder holding {VOCAB}")
    vocab = _read_json(folder / VOCAB)
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise LmforgeError(f"{folder / VOCAB} is not a {{token: id}} object; rewrite or replace it")
    if (folder / META).exists():
        meta = _read_json(folder / META)
        try:
            pattern = meta["pattern"]
            specials = {str(s): int(i) for s, i in meta["special_tokens"].items()}
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise LmforgeError(
                f"{folder / META} lacks 'pattern' or 'special_tokens' ({e}); rewrite or delete it"
            ) from None
    else:
        pattern = GPT2_PATTERN
        specials = {t: i for t, i in vocab.items() if SPECIAL_FORM.fullmatch(t)}
    ranks = {}
    for text, i in vocab.items():
        if specials.get(text) == i:
            continue
        try:
            ranks[text_to_bytes(text)] = i
        except KeyError:
            raise LmforgeError(
                f"{folder / VOCAB} holds {text!r}, which is not GPT-2 byte-mapped text; "
                "rewrite it with lmforge's Tokenizer.save"
            ) from None
    merges = _read_merges(folder / MERGES) if (folder / MERGES).exists() else None
    return Tokenizer(ranks, specials, pattern, merges=merges)


def _read_json(path: Path) -> object:
    if not path.is_file():
        raise LmforgeError(f"{path} not found; the tokenizer folder needs it (save one there)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LmforgeError(f"{path} is not valid JSON ({e}); rewrite or replace it") from None


def _read_merges(path: Path) -> list[tuple[bytes, bytes]]:
    merges = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line or (n == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        try:
            if len(parts) != 2:
                raise KeyError(line)
            merges.append((text_to_bytes(parts[0]), text_to_bytes(parts[1])))
        except KeyError:
            raise LmforgeError(
                f"{path} line {n} is not a GPT-2 merge ('A B'); fix the line or delete the file"
            ) from None
    return merges
