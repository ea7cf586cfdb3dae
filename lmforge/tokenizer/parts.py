"""The plain data a tokenizer is made of, as its file formats read and write it.

The file modules (files.py, hf_json.py) read `Parts` and write anything `HasParts`; only
`Tokenizer` (tokenizer.py) builds a tokenizer from them, so the formats never import it.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol


class Parts(NamedTuple):
    ranks: dict[bytes, int]
    specials: dict[str, int]
    pattern: str
    merges: list[tuple[bytes, bytes]] | None = None


class HasParts(Protocol):
    """What writing a tokenizer reads of it."""

    @property
    def mergeable_ranks(self) -> dict[bytes, int]: ...

    @property
    def special_tokens(self) -> dict[str, int]: ...

    @property
    def pattern(self) -> str: ...

    @property
    def merges(self) -> list[tuple[bytes, bytes]]: ...
