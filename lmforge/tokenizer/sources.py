"""Training input as a stream of chunks: texts and files read piece by piece, never whole.

A chunk is a batch of independent texts of about `chunk_bytes`. A longer text (a big .txt file, a
long string) is cut only at `cut_point`s, so counting its pieces equals counting it whole; cuts
depend on the input and `chunk_bytes` alone, never on the number of workers. A JSONL chunk holds
whole lines, parsed by the worker that counts it. Bytes that are not UTF-8 are replaced by U+FFFD
(or skipped) and counted.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

from lmforge.errors import LmforgeError
from lmforge.tokenizer.pretokenize import cut_point

CHUNK_BYTES = 1 << 20
MAX_CARRY = 16  # text with no cut point grows to this many chunks, then is cut at a newline
InvalidUtf8 = Literal["replace", "skip"]


@dataclass(frozen=True)
class Chunk:
    """Independent texts, or (when `jsonl`) one block of JSON Lines whose 'text' fields are."""

    texts: tuple[str, ...]
    jsonl: bool = False
    origin: str = ""  # the file, for error messages
    first_line: int = 1

    @property
    def size(self) -> int:
        return sum(map(len, self.texts))


@dataclass
class InputStats:
    """What reading the input found; filled in as chunks are produced."""

    files: int = 0
    bytes: int = 0
    invalid_utf8: int = 0  # invalid byte sequences, each replaced or skipped
    invalid_files: list[str] = field(default_factory=list)


def text_chunks(
    texts: Iterable[str], specials: Sequence[str], chunk_bytes: int = CHUNK_BYTES
) -> Iterator[Chunk]:
    """In-memory texts batched into chunks; each text stays independent of the others."""
    batch: list[str] = []
    size = 0
    for text in texts:
        if len(text) > chunk_bytes:
            blocks = (text[i : i + chunk_bytes] for i in range(0, len(text), chunk_bytes))
            pieces: Iterable[str] = _pieces(blocks, specials, chunk_bytes)
        else:
            pieces = (text,)
        for piece in pieces:
            batch.append(piece)
            size += len(piece)
            if size >= chunk_bytes:
                yield Chunk(tuple(batch))
                batch, size = [], 0
    if batch:
        yield Chunk(tuple(batch))


def file_chunks(
    paths: Sequence[str | Path],
    specials: Sequence[str],
    chunk_bytes: int = CHUNK_BYTES,
    invalid_utf8: InvalidUtf8 = "replace",
    stats: InputStats | None = None,
    max_bytes: int = 0,
) -> Iterator[Chunk]:
    """Chunks of every file in `paths` (files, or folders of .txt/.jsonl files), read
    `chunk_bytes` at a time. A .jsonl file gives its lines' 'text' fields; any other file is one
    text. `max_bytes` (0: no limit) stops reading there (a JSONL line is read to its end)."""
    stats = stats if stats is not None else InputStats()
    for path in input_files(paths):
        if max_bytes and stats.bytes >= max_bytes:
            return
        stats.files += 1
        before = stats.invalid_utf8
        decoder = _Decoder(invalid_utf8, stats)
        jsonl = path.suffix == ".jsonl"
        with open(path, "rb") as f:
            blocks = _blocks(f, chunk_bytes, stats, max_bytes, whole_lines=jsonl)
            if jsonl:
                yield from _jsonl_chunks(blocks, decoder, str(path))
            else:
                for piece in _pieces(decoder.stream(blocks), specials, chunk_bytes):
                    yield Chunk((piece,), origin=str(path))
        if stats.invalid_utf8 > before:
            stats.invalid_files.append(str(path))


def input_files(paths: Sequence[str | Path]) -> Iterator[Path]:
    """Each path that is a file, and the .txt/.jsonl files under each folder, sorted."""
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(
                f for f in p.rglob("*") if f.is_file() and f.suffix in (".txt", ".jsonl")
            )
            if not found:
                raise LmforgeError(
                    f"folder {p} holds no .txt or .jsonl files; add some or pass files"
                )
            yield from found
        elif p.is_file():
            yield p
        else:
            raise LmforgeError(f"training input {p} does not exist; pass existing files or folders")


def jsonl_texts(chunk: Chunk) -> Iterator[str]:
    """The 'text' field of each line of a JSONL chunk; a bad line raises, naming file and line."""
    for number, line in enumerate(chunk.texts[0].split("\n"), start=chunk.first_line):
        if not line.strip():
            continue
        try:
            text = json.loads(line)["text"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise LmforgeError(
                f"{chunk.origin}:{number} is not a JSON object with a 'text' field; "
                "fix or remove that line"
            ) from None
        if isinstance(text, str):
            yield text


def _pieces(blocks: Iterable[str], specials: Sequence[str], chunk_bytes: int) -> Iterator[str]:
    """One long text, arriving in blocks, as pieces of at most about `chunk_bytes`, cut at cut
    points (or, past MAX_CARRY chunks without one, at a newline)."""
    margin = max((len(s) for s in specials if s), default=1)
    carry = ""
    for block in blocks:
        carry += block
        while len(carry) >= chunk_bytes:
            last = len(carry) - margin  # a special token may continue past the end
            cut = cut_point(carry, specials, end=min(chunk_bytes, last))
            cut = cut or cut_point(carry, specials, end=last)
            if not cut and len(carry) >= MAX_CARRY * chunk_bytes:
                cut = carry.rfind("\n", 0, last) + 1 or last
            if not cut:
                break  # wait for more text
            yield carry[:cut]
            carry = carry[cut:]
    if carry:
        yield carry


def _jsonl_chunks(blocks: Iterable[bytes], decoder: _Decoder, origin: str) -> Iterator[Chunk]:
    """Blocks of whole lines; a line longer than a block waits for the rest of itself."""
    rest = b""
    line = 1
    for block in blocks:
        data = rest + block
        end = data.rfind(b"\n") + 1
        rest = data[end:]
        if end:
            text = decoder.decode(data[:end])
            yield Chunk((text,), jsonl=True, origin=origin, first_line=line)
            line += text.count("\n")
    if rest:
        yield Chunk((decoder.decode(rest, final=True),), jsonl=True, origin=origin, first_line=line)


def _blocks(
    f: BinaryIO, chunk_bytes: int, stats: InputStats, max_bytes: int, whole_lines: bool
) -> Iterator[bytes]:
    """Blocks of `f`, counted into `stats`, until the end or `max_bytes` in all."""
    while True:
        size = chunk_bytes if not max_bytes else min(chunk_bytes, max_bytes - stats.bytes)
        block = f.read(size) if size > 0 else b""
        if size <= 0 and whole_lines:
            block = f.readline()  # finish the line the limit fell in
        if not block:
            return
        stats.bytes += len(block)
        yield block
        if size <= 0:
            return


class _Decoder:
    """Incremental UTF-8 decoding whose invalid byte sequences are counted into `stats`."""

    def __init__(self, invalid_utf8: InvalidUtf8, stats: InputStats) -> None:
        if invalid_utf8 not in ("replace", "skip"):
            raise LmforgeError(f"invalid_utf8={invalid_utf8!r}: use 'replace' or 'skip'")
        self._replacement = "\ufffd" if invalid_utf8 == "replace" else ""
        self._stats = stats
        self._inner = codecs.getincrementaldecoder("utf-8")(errors=_HANDLER)

    def decode(self, data: bytes, final: bool = False) -> str:
        _active.append(self)
        try:
            return self._inner.decode(data, final)
        finally:
            _active.pop()

    def stream(self, blocks: Iterable[bytes]) -> Iterator[str]:
        for block in blocks:
            yield self.decode(block)
        yield self.decode(b"", final=True)

    def on_error(self, error: UnicodeDecodeError) -> tuple[str, int]:
        self._stats.invalid_utf8 += 1
        return self._replacement, error.end


# Codec error handlers are registered globally by name; this one hands each error to the decoder
# whose decode() call is running.
_HANDLER = "lmforge.tokenizer.count_invalid_utf8"
_active: list[_Decoder] = []


def _on_error(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeDecodeError)
    return _active[-1].on_error(error)


codecs.register_error(_HANDLER, _on_error)
