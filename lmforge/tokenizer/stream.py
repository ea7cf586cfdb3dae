"""Encoding a stream of text (lines of a file) lazily, in memory that does not grow with it.

Text is buffered to about `buffer_chars`, then encoded up to the buffer's last `cut_point`, so
the ids are exactly those of encoding the whole text at once (for the GPT-2 and GPT-4 patterns).
The buffer grows past `buffer_chars` only while no cut point has arrived (one endless word).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from lmforge.tokenizer.pretokenize import cut_point

BUFFER_CHARS = 1 << 16


def encode_stream(
    encode: Callable[[str], list[int]],
    pieces: Iterable[str],
    specials: Sequence[str],
    buffer_chars: int = BUFFER_CHARS,
) -> Iterator[int]:
    """The ids of `"".join(pieces)`, one at a time, encoded with `encode` a buffer at a time."""
    margin = max((len(s) for s in specials), default=1)
    buffer: list[str] = []
    size = 0
    next_try = buffer_chars
    for piece in pieces:
        buffer.append(piece)
        size += len(piece)
        if size < next_try:
            continue
        text = "".join(buffer)
        cut = cut_point(text, specials, end=len(text) - margin)
        if cut:
            yield from encode(text[:cut])
            buffer, size, next_try = [text[cut:]], len(text) - cut, buffer_chars
        else:  # no cut point yet: wait for twice as much, so joining stays linear
            buffer, next_try = [text], 2 * size
    if buffer:
        yield from encode("".join(buffer))
