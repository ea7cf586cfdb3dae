"""The C4-style word-list filter: documents that contain listed words (whole words, any case).

The default list (`wordlists/nsfw_en.txt`, in the package) is short and clinical; any list of
one word or phrase per line can replace it. Phrases match across any run of whitespace.
"""

from __future__ import annotations

import re
from pathlib import Path

from lmforge.errors import LmforgeError

DEFAULT_LIST = Path(__file__).parent / "wordlists" / "nsfw_en.txt"


class WordList:
    def __init__(self, words: list[str]) -> None:
        self.words = sorted({w.lower() for w in words}, key=len, reverse=True)
        alternatives = "|".join(r"\s+".join(map(re.escape, w.split())) for w in self.words)
        self.pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)
        self.heads = sorted({w.split()[0] for w in self.words})

    @classmethod
    def load(cls, path: str | Path = DEFAULT_LIST) -> WordList:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise LmforgeError(f"word list {path} cannot be read ({e}): fix the path") from e
        words = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        if not words:
            raise LmforgeError(f"word list {path} holds no words: add one per line")
        return cls(words)

    def hits(self, text: str) -> list[str]:
        """The listed words found in `text`, lowercased, in order of appearance."""
        lowered = text.lower()
        if not any(head in lowered for head in self.heads):
            return []  # a substring search per word is far faster than the regex over all
        return [" ".join(m.group(0).lower().split()) for m in self.pattern.finditer(text)]
