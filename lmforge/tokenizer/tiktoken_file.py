"""tiktoken's ranks format: one `base64(token) rank` line per token, as in `gpt2.tiktoken`.

The format holds the ranks only; the pattern and special tokens travel separately.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from lmforge.errors import LmforgeError


def write_tiktoken(ranks: dict[bytes, int], path: str | Path) -> None:
    lines = [
        f"{base64.b64encode(token).decode('ascii')} {rank}\n"
        for token, rank in sorted(ranks.items(), key=lambda item: item[1])
    ]
    Path(path).write_text("".join(lines), encoding="ascii")


def read_tiktoken(path: str | Path) -> dict[bytes, int]:
    path = Path(path)
    if not path.is_file():
        raise LmforgeError(f"{path} not found; pass a tiktoken ranks file")
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token_b64, rank_text = line.split()
            token = base64.b64decode(token_b64, validate=True)
            rank = int(rank_text)
        except (ValueError, binascii.Error):
            raise LmforgeError(
                f"{path} line {n} is not 'BASE64 RANK' ({line[:40]!r}); fix it or replace the file"
            ) from None
        if token in ranks:
            raise LmforgeError(f"{path} line {n} repeats token {token!r}; fix or replace the file")
        ranks[token] = rank
    return ranks
