"""Tokenizer folders on disk: every format written together, and whichever is there read back.

A folder holds vocab.json + merges.txt (GPT-2), tokenizer.json (Hugging Face),
tokenizer.tiktoken (tiktoken ranks) and lmforge_tokenizer.json (pattern and special tokens).
Reading takes the first of vocab.json, tokenizer.json, tokenizer.tiktoken that is present, so a
folder with only GPT-2's published vocab.json + merges.txt loads too. Saving writes a complete
new folder first and swaps it in, so a crash never leaves a half-written tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.tokenizer.gpt2_files import merges_txt, parse_merges, parse_vocab, vocab_json
from lmforge.tokenizer.hf_json import from_json, to_json
from lmforge.tokenizer.parts import HasParts, Parts
from lmforge.tokenizer.pretokenize import GPT2_PATTERN
from lmforge.tokenizer.tiktoken_file import read_tiktoken, write_tiktoken

VOCAB = "vocab.json"
MERGES = "merges.txt"
HF_JSON = "tokenizer.json"
TIKTOKEN = "tokenizer.tiktoken"
META = "lmforge_tokenizer.json"


def save(tokenizer: HasParts, directory: str | Path) -> None:
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


def _write(tokenizer: HasParts, folder: Path) -> None:
    ranks, specials = tokenizer.mergeable_ranks, tokenizer.special_tokens
    (folder / VOCAB).write_text(vocab_json(ranks, specials), encoding="utf-8")
    (folder / MERGES).write_text(merges_txt(tokenizer.merges), encoding="utf-8")
    hf = json.dumps(to_json(tokenizer), ensure_ascii=False, indent=1)
    (folder / HF_JSON).write_text(hf, encoding="utf-8")
    write_tiktoken(ranks, folder / TIKTOKEN)
    meta = {"pattern": tokenizer.pattern, "special_tokens": specials}
    (folder / META).write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")


def load(path: str | Path) -> Parts:
    """The parts of the tokenizer in folder `path`, or in the tokenizer.json file `path`."""
    path = Path(path)
    if path.is_file() and path.suffix == ".json":
        return from_json(_read_json(path), str(path))
    if path.is_file():
        raise LmforgeError(
            f"{path} is a file; pass a tokenizer folder or a tokenizer.json file "
            "(a .tiktoken file loads with Tokenizer.load_tiktoken and its special tokens)"
        )
    if not path.is_dir():
        raise LmforgeError(
            f"tokenizer folder {path} not found; pass a folder holding {VOCAB} + {MERGES}, "
            f"{HF_JSON} or {TIKTOKEN}"
        )
    pattern, specials = _read_meta(path / META)
    if (path / VOCAB).exists():
        ranks, specials = parse_vocab(_read_json(path / VOCAB), str(path / VOCAB), specials)
        merges = None
        if (path / MERGES).exists():
            lines = (path / MERGES).read_text(encoding="utf-8").splitlines()
            merges = parse_merges(lines, ranks, str(path / MERGES))
        return Parts(ranks, specials, pattern or GPT2_PATTERN, merges)
    if (path / HF_JSON).exists():
        return from_json(_read_json(path / HF_JSON), str(path / HF_JSON))
    if (path / TIKTOKEN).exists():
        ranks = read_tiktoken(path / TIKTOKEN)
        return Parts(ranks, specials or {}, pattern or GPT2_PATTERN)
    raise LmforgeError(
        f"{path / VOCAB} not found, nor {HF_JSON} or {TIKTOKEN}; the tokenizer folder needs one "
        "(save one there)"
    )


def _read_meta(path: Path) -> tuple[str | None, dict[str, int] | None]:
    if not path.exists():
        return None, None
    meta = _read_json(path)
    try:
        pattern = meta["pattern"]  # type: ignore[index]
        specials = {str(s): int(i) for s, i in meta["special_tokens"].items()}  # type: ignore[index]
        if not isinstance(pattern, str):
            raise TypeError(pattern)
    except (TypeError, KeyError, AttributeError, ValueError) as e:
        raise LmforgeError(
            f"{path} lacks 'pattern' or 'special_tokens' ({e}); rewrite or delete it"
        ) from None
    return pattern, specials


def _read_json(path: Path) -> object:
    if not path.is_file():
        raise LmforgeError(f"{path} not found; the tokenizer folder needs it (save one there)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LmforgeError(f"{path} is not valid JSON ({e}); rewrite or replace it") from None
