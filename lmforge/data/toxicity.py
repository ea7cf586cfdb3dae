"""NSFW and toxic-language verdicts for one document: word lists that see through obfuscation.

    is_nsfw(text) -> ("nsfw" | "clean", score)     # sexual content (wordlists/nsfw_en.txt)
    is_toxic(text) -> ("toxic" | "clean", score)   # profanity, slurs, insults (toxic_en.txt)

The score is 1 - 2**-hits (0 for none, 0.5 for one listed word, 0.75 for two, ...); a document is
labelled when it has more than `max_hits` hits. Lists hold one word or phrase per line, matched
as whole words in any case; `stem*` matches any ending and `!phrase` marks words that never count
there (`!cum laude`). Matching runs on `deobfuscate(text)`: leetspeak undone (`sh1t`, `$hit`),
spaced letters joined (`f u c k`, `c-u-n-t`), letter runs squeezed (`fuuuck`); a word with `*`
masks (`f*ck`, `f**k`, `c*nt`) matches a listed word that the masks can stand for. Which lists
ship and why this, rather than a trained classifier, is the default: benchmarks/bench_toxicity.py.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

from lmforge.errors import LmforgeError

WORDLISTS = Path(__file__).parent / "wordlists"
NSFW_LIST = WORDLISTS / "nsfw_en.txt"
TOXIC_LIST = WORDLISTS / "toxic_en.txt"
DEFAULT_LIST = NSFW_LIST  # the list that `toxicity.word_list` replaces

# Endings a `stem*` entry stands for when matched against a masked word such as `f***ing`.
_SUFFIXES = ("", "s", "ed", "er", "ers", "ing", "in", "y", "ty", "head", "face", "es")
_LEET = str.maketrans("013457@$", "oieasta" + "s")
_SPACED = re.compile(r"(?<![\w@$*])[a-z]([ .\-_])[a-z](?:\1[a-z])+(?![\w@$*])")
_LEET_WORD = re.compile(r"[a-z0-9@$]*[a-z][a-z0-9@$]*|[@$][a-z0-9@$]+")
_BANG = re.compile(r"(?<=[a-z])!(?=[a-z])")
_RUN = re.compile(r"([a-z])\1{2,}")
_MASKED = re.compile(r"(?<![\w*])[a-z][a-z*]*\*[a-z*]*")


def deobfuscate(text: str) -> str:
    """`text` lowercased, leetspeak undone, spaced-out letters joined, letter runs squeezed."""
    t = unicodedata.normalize("NFKC", text).lower()
    t = _SPACED.sub(lambda m: m.group(0).replace(m.group(1), ""), t)
    t = _BANG.sub("i", t)
    t = _LEET_WORD.sub(lambda m: m.group(0).translate(_LEET), t)
    return _RUN.sub(r"\1", t)


def _entry_pattern(entry: str) -> str:
    words = entry.split()
    stem = r"\s+".join(map(re.escape, (w.rstrip("*") for w in words)))
    return stem + (r"\w*" if words[-1].endswith("*") else "")


class WordList:
    def __init__(self, words: list[str]) -> None:
        entries = {w.lower().strip() for w in words if w.strip()}
        exceptions = sorted((e[1:].strip() for e in entries if e.startswith("!")), key=len)
        self.words = sorted((e for e in entries if not e.startswith("!")), key=len, reverse=True)
        alternatives = "|".join(map(_entry_pattern, self.words)) or r"(?!x)x"
        self.pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)
        self.exceptions = (
            re.compile(rf"(?<!\w)(?:{'|'.join(map(_entry_pattern, exceptions[::-1]))})(?!\w)")
            if exceptions
            else None
        )
        self.heads = sorted({max(w.split(), key=len).rstrip("*") for w in self.words})
        singles = [w for w in self.words if " " not in w]
        self.vocabulary = sorted(
            {w.rstrip("*") + s for w in singles for s in (_SUFFIXES if w.endswith("*") else ("",))}
        )

    @classmethod
    def load(cls, path: str | Path = DEFAULT_LIST) -> WordList:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise LmforgeError(f"word list {path} cannot be read ({e}): fix the path") from e
        words = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        if not any(not w.startswith("!") for w in words):
            raise LmforgeError(f"word list {path} holds no words: add one per line")
        return cls(words)

    def hits(self, text: str) -> list[str]:
        """The listed words found as written in `text`, lowercased, in order of appearance."""
        lowered = text.lower()
        if not any(head in lowered for head in self.heads):
            return []  # a substring search per entry (its longest word) beats the regex
        if self.exceptions is not None:
            lowered = self.exceptions.sub(lambda m: " " * len(m.group(0)), lowered)
        return [" ".join(m.group(0).split()) for m in self.pattern.finditer(lowered)]

    def find(self, text: str) -> list[str]:
        """`hits` in the deobfuscated text, then the masked words (`f*ck`) a listed word fits."""
        clear = deobfuscate(text)
        found = self.hits(clear)
        if "*" in clear:
            found += [w for m in _MASKED.finditer(clear) if (w := self._unmask(m.group(0)))]
        return found

    def _unmask(self, token: str) -> str | None:
        letters = token.replace("*", "")
        if len(token) < 3 or len(letters) * 2 < len(token):
            return None  # `a*` or `x**`: arithmetic or markup, not a masked word
        shape = re.compile("".join(_mask_parts(token)))
        return next((w for w in self.vocabulary if w[0] == token[0] and shape.fullmatch(w)), None)

    def verdict(self, text: str, label: str, max_hits: int = 0) -> tuple[str, float]:
        """(`label` or "clean", 1 - 2**-hits): `label` when `text` has more than `max_hits` hits."""
        n = len(self.find(text))
        return (label if n > max_hits else "clean"), 1.0 - 0.5**n


def _mask_parts(token: str) -> list[str]:
    """`f**k` -> ['f', '[a-z]{2}', 'k']: a run of n masks hides n letters (one mask, 1 or 2)."""
    runs = re.findall(r"\*+|[^*]+", token)
    return [p if p[0] != "*" else "[a-z]{1,2}" if p == "*" else f"[a-z]{{{len(p)}}}" for p in runs]


@cache
def default_list(kind: str) -> WordList:
    """The shipped list for `kind`, "nsfw" or "toxic", loaded once."""
    return WordList.load({"nsfw": NSFW_LIST, "toxic": TOXIC_LIST}[kind])


def is_nsfw(text: str, words: WordList | None = None, max_hits: int = 0) -> tuple[str, float]:
    """("nsfw" or "clean", score) for sexual content; `words` replaces the shipped list."""
    return (words or default_list("nsfw")).verdict(text, "nsfw", max_hits)


def is_toxic(text: str, words: WordList | None = None, max_hits: int = 0) -> tuple[str, float]:
    """("toxic" or "clean", score) for profanity, slurs and insults; `words` replaces the list."""
    return (words or default_list("toxic")).verdict(text, "toxic", max_hits)
