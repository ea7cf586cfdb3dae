"""`lmforge tokenizer stats`: compression (UTF-8 bytes per token) of tokenizers side by side.

A tokenizer is named by a folder (any format `Tokenizer.load` reads), a `.tiktoken` ranks file
(GPT-2's pattern and `<|endoftext|>` assumed, as in GPT-2's own file), or `gpt2`: tiktoken's
GPT-2 encoding, which tiktoken downloads once into its cache if it is not there yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.tokenizer.tokenizer import Tokenizer


@dataclass
class CompressionRow:
    name: str
    vocab_size: int
    tokens: int
    bytes: int

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / max(1, self.tokens)


def load_named(name: str) -> Tokenizer:
    if name == "gpt2":
        import tiktoken

        try:
            enc = tiktoken.get_encoding("gpt2")
        except Exception as e:  # tiktoken reports a failed download in several ways
            raise LmforgeError(
                f"tiktoken could not load GPT-2's encoding ({e}): pass GPT-2's vocab.json + "
                "merges.txt folder or its .tiktoken file instead"
            ) from e
        return Tokenizer(enc._mergeable_ranks, enc._special_tokens, enc._pat_str)
    path = Path(name)
    if path.suffix == ".tiktoken" and path.is_file():
        ranks_tokenizer = Tokenizer.load_tiktoken(path)
        return Tokenizer.load_tiktoken(path, {"<|endoftext|>": ranks_tokenizer.vocab_size})
    return Tokenizer.load(path)


def compression(tokenizers: dict[str, Tokenizer], texts: Iterable[str]) -> list[CompressionRow]:
    """Tokens and bytes of the same texts under each tokenizer (special tokens as plain text)."""
    rows = {name: CompressionRow(name, t.vocab_size, 0, 0) for name, t in tokenizers.items()}
    for text in texts:
        n_bytes = len(text.encode("utf-8"))
        for name, tokenizer in tokenizers.items():
            rows[name].tokens += len(tokenizer.encode_ordinary(text))
            rows[name].bytes += n_bytes
    return list(rows.values())


def format_table(rows: Sequence[CompressionRow]) -> str:
    base = rows[0].bytes_per_token
    lines = [
        "| tokenizer | vocab | tokens | bytes/token | vs first |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.name} | {row.vocab_size:,} | {row.tokens:,} | {row.bytes_per_token:.3f} "
            f"| {row.bytes_per_token / base:.2f}x |"
        )
    return "\n".join(lines)
