"""Byte streams of possibly compressed files (.gz, .zst), read in chunks or lines.

Decompression goes through decompressor objects rather than file wrappers so that a truncated
file is noticed (zstd's stream reader ends silently) and a half line at the cut is never yielded:
everything before it arrives, then `TruncatedFile` is raised.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

from lmforge.extras import import_extra

CHUNK = 1 << 20
COMPRESSED = (".gz", ".zst", ".zstd")


class TruncatedFile(Exception):
    """The compressed stream ended before its end marker."""


class CorruptFile(Exception):
    """The compressed stream holds bytes its decoder rejects."""


def strip_compression(name: str) -> str:
    """`a.jsonl.zst` -> `a.jsonl`."""
    for suffix in COMPRESSED:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def read_chunks(path: str | Path) -> Iterator[bytes]:
    """Decompressed chunks of the file; raises TruncatedFile or CorruptFile at a bad spot."""
    name = str(path)
    with open(path, "rb") as f:
        raw = iter(lambda: f.read(CHUNK), b"")
        if name.endswith(".gz"):
            yield from _decompress(raw, lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), zlib.error)
        elif name.endswith((".zst", ".zstd")):
            zstandard = import_extra("zstandard", "reading .zst files", "data")
            new = zstandard.ZstdDecompressor().decompressobj
            yield from _decompress(raw, new, zstandard.ZstdError)
        else:
            yield from raw


def read_lines(path: str | Path) -> Iterator[bytes]:
    """Lines of the decompressed file without their line ends; a cut final line is dropped."""
    pending: list[bytes] = []  # pieces of a line longer than a chunk, joined once
    for chunk in read_chunks(path):
        lines = chunk.split(b"\n")
        if len(lines) == 1:
            pending.append(chunk)
            continue
        pending.append(lines[0])
        yield b"".join(pending)
        yield from lines[1:-1]
        pending = [lines[-1]]
    tail = b"".join(pending)
    if tail:
        yield tail


def read_all(path: str | Path) -> bytes:
    return b"".join(read_chunks(path))


def _decompress(raw: Iterator[bytes], new, error: type[Exception]) -> Iterator[bytes]:
    decoder = new()
    fed = False
    for data in raw:
        while data:
            fed = True
            try:
                out = decoder.decompress(data)
            except error as e:
                raise CorruptFile(str(e)) from e
            if out:
                yield out
            if not decoder.eof:
                break
            data = decoder.unused_data  # the next member (gzip) or frame (zstd)
            decoder, fed = new(), False
    if fed and not decoder.eof:
        raise TruncatedFile("compressed stream ended before its end marker")
