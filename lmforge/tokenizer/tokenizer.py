"""The Tokenizer: tiktoken-compatible byte-level BPE encoding and decoding of text.

Ids are ranks; special tokens sit outside the ranks. Encoding runs on tiktoken's compiled core
when available, else on the pure-Python reference (`backend.py`); both give the same ids. The
Tokenizer holds plain data only (ranks, special tokens, pattern), so it pickles cheaply to worker
processes; file formats live in `files.py`.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from lmforge.errors import LmforgeError
from lmforge.tokenizer import backend as backends
from lmforge.tokenizer.bpe import PythonBPE, merge_parts
from lmforge.tokenizer.pretokenize import GPT2_PATTERN, special_regex, split_special
from lmforge.tokenizer.stream import encode_stream
from lmforge.tokenizer.workers import context, default_workers

EOT = "<|endoftext|>"
PROCESS_MIN_CHARS = 1 << 20  # the pure-Python batch encoder starts processes above this much text
Specials = Iterable[str] | Literal["all"]


class Tokenizer:
    """Byte-level BPE with tiktoken's semantics: ids are ranks; specials sit outside the ranks."""

    def __init__(
        self,
        mergeable_ranks: dict[bytes, int],
        special_tokens: dict[str, int],
        pattern: str = GPT2_PATTERN,
        *,
        merges: Sequence[tuple[bytes, bytes]] | None = None,
        backend: str | None = None,
    ) -> None:
        missing = [b for b in range(256) if bytes([b]) not in mergeable_ranks]
        if missing:
            raise LmforgeError(
                f"tokenizer ranks lack {len(missing)} single bytes (first: {missing[0]}); "
                "use a byte-level vocabulary that holds all 256 bytes"
            )
        if any(not isinstance(s, str) or not s for s in special_tokens):
            raise LmforgeError("a special token is empty; special tokens must be non-empty text")
        ids = [*mergeable_ranks.values(), *special_tokens.values()]
        if len(set(ids)) != len(ids):
            raise LmforgeError(
                "tokenizer ids are not unique; fix the vocabulary so each id is used once"
            )
        if min(ids) < 0:
            raise LmforgeError(f"tokenizer id {min(ids)} is negative; ids start at 0")
        self._ranks = dict(mergeable_ranks)
        self._special = dict(special_tokens)
        self._pattern = pattern
        self._merges = list(merges) if merges is not None else None
        self._requested = backends.requested(backend)
        self._decoder = {rank: token for token, rank in self._ranks.items()}
        self._decoder.update({i: s.encode("utf-8") for s, i in self._special.items()})
        self._vocab_size = max(self._decoder) + 1
        # tiktoken finds special tokens with an alternation in arbitrary order; that agrees with
        # "the longest wins" only while no special token is a prefix of another.
        self._specials_prefix_free = not any(
            a != b and b.startswith(a) for a in self._special for b in self._special
        )
        self._core: Any | None = None
        self._python: PythonBPE | None = None
        self._fingerprint: str | None = None

    # Pickle the data only: caches may be large and the compiled core is rebuilt on first use.
    def __getstate__(self) -> dict[str, Any]:
        return {
            "mergeable_ranks": self._ranks,
            "special_tokens": self._special,
            "pattern": self._pattern,
            "merges": self._merges,
            "backend": self._requested,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, special_tokens={len(self._special)})"

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    @property
    def mergeable_ranks(self) -> dict[bytes, int]:
        return dict(self._ranks)

    @property
    def eot_id(self) -> int | None:
        return self._special.get(EOT)

    @property
    def pattern(self) -> str:
        return self._pattern

    @property
    def backend(self) -> str:
        """The encoder in use: "tiktoken" (compiled) or "python" (the reference)."""
        return "tiktoken" if self._tiktoken() is not None else "python"

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """Merge pairs in rank order. When not given, each multi-byte token's pair is the split
        that BPE with only lower ranks leaves (as the tiktoken -> Hugging Face converters do);
        tokens BPE cannot reach in one final merge have no pair."""
        if self._merges is None:
            merges = []
            for token, rank in sorted(self._ranks.items(), key=lambda item: item[1]):
                if len(token) > 1:
                    parts = merge_parts(self._ranks, token, max_rank=rank)
                    if len(parts) == 2:
                        merges.append((parts[0], parts[1]))
            self._merges = merges
        return list(self._merges)

    # -- encoding -------------------------------------------------------------------------

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode `text` with special tokens treated as plain text."""
        core = self._tiktoken()
        if core is not None:
            return core.encode_ordinary(text)
        return self._reference().encode_ordinary(text)

    def encode(
        self,
        text: str,
        *,
        allowed_special: Specials = frozenset(),
        disallowed_special: Specials = "all",
    ) -> list[int]:
        """Encode like tiktoken: allowed special tokens become their single id (the longest wins
        where they overlap); finding a disallowed one raises ValueError; any other special text
        is encoded as plain text."""
        allowed = self._allowed(allowed_special, disallowed_special, text)
        if not allowed:
            return self.encode_ordinary(text)
        core = self._tiktoken()
        if core is not None and self._specials_prefix_free:
            return core.encode(text, allowed_special=allowed, disallowed_special=())
        ids: list[int] = []
        for piece, is_special in split_special(text, allowed):
            if is_special:
                ids.append(self._special[piece])
            else:
                ids.extend(self.encode_ordinary(piece))
        return ids

    def encode_batch(
        self,
        texts: Iterable[str],
        *,
        workers: int | None = None,
        allowed_special: Specials = frozenset(),
        disallowed_special: Specials = "all",
    ) -> list[list[int]]:
        """`encode` of each text, in parallel: threads on the compiled core (it releases the
        GIL), processes for the pure-Python encoder when there is enough text to pay for them."""
        texts = list(texts)
        encode = functools.partial(
            self.encode, allowed_special=allowed_special, disallowed_special=disallowed_special
        )
        workers = min(workers or default_workers(), len(texts))
        if workers <= 1:
            return [encode(t) for t in texts]
        if self.backend == "tiktoken":
            with ThreadPoolExecutor(workers) as pool:
                return list(pool.map(encode, texts))
        if sum(map(len, texts)) < PROCESS_MIN_CHARS:
            return [encode(t) for t in texts]
        with context().Pool(workers, _init_worker, (self, encode.keywords)) as pool:
            return pool.map(_encode_in_worker, texts, chunksize=max(1, len(texts) // workers // 8))

    def encode_iterable(
        self,
        pieces: Iterable[str],
        *,
        allowed_special: Specials = frozenset(),
        disallowed_special: Specials = "all",
    ) -> Iterator[int]:
        """The ids of `"".join(pieces)` (say, the lines of a file), yielded lazily, with memory
        that does not grow with the input."""
        encode = functools.partial(
            self.encode, allowed_special=allowed_special, disallowed_special=disallowed_special
        )
        return encode_stream(encode, pieces, list(self._special))

    # -- decoding -------------------------------------------------------------------------

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        if hasattr(ids, "tolist"):  # numpy arrays, torch tensors
            ids = ids.tolist()  # type: ignore[union-attr]
        try:
            return b"".join(map(self._decoder.__getitem__, ids))
        except (KeyError, TypeError) as e:
            raise self._unknown(e) from None

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Text of `ids`; bytes that do not form UTF-8 (a character cut between two sequences)
        become U+FFFD, or raise with `errors="strict"`."""
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    def token_bytes(self, id: int) -> bytes:
        try:
            return self._decoder[id]
        except (KeyError, TypeError) as e:
            raise self._unknown(e) from None

    # -- identity and files ---------------------------------------------------------------

    def fingerprint(self) -> str:
        """sha256 over ranks, special tokens and pattern; equal tokenizers share it everywhere."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            h.update(self._pattern.encode("utf-8") + b"\0")
            for token, rank in sorted(self._ranks.items(), key=lambda item: item[1]):
                h.update(b"%d:%d:" % (rank, len(token)) + token)
            for special, i in sorted(self._special.items(), key=lambda item: item[1]):
                encoded = special.encode("utf-8")
                h.update(b"%d:%d:" % (i, len(encoded)) + encoded)
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def to_tiktoken(self) -> Any:
        """This tokenizer as a `tiktoken.Encoding` (same ids; tiktoken must be installed)."""
        core = self._tiktoken()
        if core is None:
            core = backends.build_tiktoken(self._ranks, self._special, self._pattern, True)
        return core

    def save(self, directory: str | Path) -> None:
        """Write the tokenizer folder: vocab.json + merges.txt (GPT-2), tokenizer.json (Hugging
        Face), tokenizer.tiktoken (tiktoken ranks), lmforge_tokenizer.json (pattern, specials)."""
        from lmforge.tokenizer.files import save

        save(self, directory)

    @classmethod
    def load(cls, path: str | Path, *, backend: str | None = None) -> Tokenizer:
        """Read a tokenizer folder (any of the formats `save` writes; GPT-2's published
        vocab.json + merges.txt alone will do), or a Hugging Face tokenizer.json file."""
        from lmforge.tokenizer.files import load

        ranks, specials, pattern, merges = load(path)
        return cls(ranks, specials, pattern, merges=merges, backend=backend)

    def save_tiktoken(self, path: str | Path) -> None:
        """Write the ranks in tiktoken's format: one `base64(token) rank` line per token."""
        from lmforge.tokenizer.tiktoken_file import write_tiktoken

        write_tiktoken(self._ranks, path)

    @classmethod
    def load_tiktoken(
        cls,
        path: str | Path,
        special_tokens: dict[str, int] | None = None,
        pattern: str = GPT2_PATTERN,
        *,
        backend: str | None = None,
    ) -> Tokenizer:
        """A tokenizer from a tiktoken ranks file, plus the special tokens and pattern that the
        format does not hold."""
        from lmforge.tokenizer.tiktoken_file import read_tiktoken

        return cls(read_tiktoken(path), special_tokens or {}, pattern, backend=backend)

    # -- internals ------------------------------------------------------------------------

    def _tiktoken(self) -> Any | None:
        if self._core is None and self._requested != "python":
            self._core = backends.build_tiktoken(
                self._ranks, self._special, self._pattern, self._requested == "tiktoken"
            )
            if self._core is None:
                self._requested = "python"  # not available: stop trying
        return self._core

    def _reference(self) -> PythonBPE:
        if self._python is None:
            self._python = PythonBPE(self._ranks, self._pattern)
        return self._python

    def _allowed(self, allowed_special: Specials, disallowed_special: Specials, text: str) -> set:
        """The allowed special tokens; raises if `text` holds a disallowed one."""
        allowed = set(self._special) if allowed_special == "all" else set(allowed_special)
        if disallowed_special == "all":
            disallowed = set(self._special) - allowed
        else:
            disallowed = set(disallowed_special)
        if disallowed:
            found = special_regex(frozenset(disallowed)).search(text)
            if found:
                token = found.group()
                raise ValueError(
                    f"text contains the disallowed special token {token!r}; pass "
                    f"allowed_special={{{token!r}}} to encode it as one token, or "
                    "disallowed_special=() to encode it as plain text"
                )
        return allowed & self._special.keys()

    def _unknown(self, error: Exception) -> LmforgeError:
        bad = error.args[0] if isinstance(error, KeyError) else error
        return LmforgeError(
            f"cannot decode token id {bad!r}: ids of this tokenizer are integers in "
            f"0..{self._vocab_size - 1}; the ids come from another tokenizer or model"
        )


_worker_encode: Any = None


def _init_worker(tokenizer: Tokenizer, options: dict[str, Any]) -> None:
    global _worker_encode
    _worker_encode = functools.partial(tokenizer.encode, **options)


def _encode_in_worker(text: str) -> list[int]:
    return _worker_encode(text)
