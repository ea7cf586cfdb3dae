"""The step contract: a base class that owns batching, statistics and progress.

A step's subclass writes one method:

- a `Filter` writes `filter(doc) -> bool | (bool, reason)`: False drops the document;
- a `Transform` writes `transform(doc) -> Document | None`: None drops it (reason `drop_reason`);
- a `GlobalStep` (deduplication) sees the whole corpus in three parts: `keys` per shard in the
  workers, `decide` once over all shards' keys, then `apply` per shard with that decision.

Each step class names itself (`name`, used in `--steps` and `--set name.key=value`) and owns a
`Config` dataclass of its thresholds. Heavy resources (models, word lists) load in `setup`,
once per process, so a step object stays cheap to build and to ship to a worker.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any, ClassVar

import numpy as np

from lmforge.data.documents import Document
from lmforge.data.stats import StepStats

Progress = Callable[[str, int, int], None]  # (step name, documents, bytes) processed


@dataclasses.dataclass
class NoConfig:
    pass


class Step:
    name: ClassVar[str] = "step"
    Config: ClassVar[type] = NoConfig
    batch_size: ClassVar[int] = 256

    def __init__(self, config: Any = None) -> None:
        self.config = config if config is not None else self.Config()
        self.stats = StepStats(self.name)
        self.progress: Progress | None = None
        self._ready = False

    def setup(self) -> None:
        """Load what the step needs (a model, a word list); called once before the first doc."""

    def process(self, doc: Document) -> Document | str:
        """The document to pass on, or the reason (a string) it is removed."""
        raise NotImplementedError

    def process_batch(self, docs: list[Document]) -> list[Document | str]:
        return [self.process(doc) for doc in docs]

    def __call__(self, docs: Iterable[Document]) -> Iterator[Document]:
        if not self._ready:
            self.setup()
            self._ready = True
        stats = self.stats
        it = iter(docs)
        while batch := list(islice(it, self.batch_size)):
            start = time.perf_counter()
            sizes = [_nbytes(doc.text) for doc in batch]
            results = self.process_batch(batch)
            kept: list[Document] = []
            for doc, result in zip(batch, results, strict=True):
                if isinstance(result, str):
                    stats.remove(result, doc.id, doc.text)
                else:
                    kept.append(result)
                    stats.bytes_out += _nbytes(result.text)
            stats.docs_in += len(batch)
            stats.bytes_in += sum(sizes)
            stats.docs_out += len(kept)
            stats.seconds += time.perf_counter() - start
            if self.progress is not None:
                self.progress(self.name, len(batch), sum(sizes))
            yield from kept


class Filter(Step):
    """Keeps the documents for which `filter` is true; a false result may carry a reason."""

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        raise NotImplementedError

    def process(self, doc: Document) -> Document | str:
        result = self.filter(doc)
        keep, reason = result if isinstance(result, tuple) else (result, self.name)
        return doc if keep else reason


class Transform(Step):
    """Rewrites each document; returning None drops it with the reason `drop_reason`."""

    drop_reason: ClassVar[str] = "empty"

    def transform(self, doc: Document) -> Document | None:
        raise NotImplementedError

    def process(self, doc: Document) -> Document | str:
        result = self.transform(doc)
        return self.drop_reason if result is None else result


Arrays = dict[str, np.ndarray]


class GlobalStep(Step):
    """A step that needs the whole corpus (deduplication): keys, then one decision, then apply.

    `keys` runs in the workers on a shard's documents (in batches), `pack` turns the shard's
    keys into arrays saved to disk, `decide` runs once over every shard's arrays (in shard order)
    and returns one decision per shard, and `apply` runs in the workers on each document of a
    shard with its position in the shard. All three see the same documents in the same order.
    """

    def keys(self, docs: list[Document]) -> list[Any]:
        raise NotImplementedError

    def pack(self, keys: list[Any]) -> Arrays:
        raise NotImplementedError

    def decide(self, shards: list[Arrays]) -> list[Arrays]:
        raise NotImplementedError

    def prepare(self, decision: Arrays) -> Any:
        """What `apply` receives: by default the decision arrays themselves."""
        return decision

    def apply(self, doc: Document, index: int, decision: Any) -> Document | str:
        raise NotImplementedError

    def collect(self, docs: Iterable[Document], out: list[Any]) -> Iterator[Document]:
        """Pass `docs` through, appending their keys to `out`; the time counts as this step's."""
        if not self._ready:
            self.setup()
            self._ready = True
        it = iter(docs)
        while batch := list(islice(it, self.batch_size)):
            start = time.perf_counter()
            out.extend(self.keys(batch))
            self.stats.seconds += time.perf_counter() - start
            yield from batch

    def applying(self, decision: Arrays) -> Step:
        """A per-document step that applies `decision`, with this step's name and stats."""
        return _Apply(self, decision)


class _Apply(Step):
    def __init__(self, owner: GlobalStep, decision: Arrays) -> None:
        super().__init__(owner.config)
        self.name = owner.name  # type: ignore[misc]
        self.stats = owner.stats
        self.owner = owner
        self.decision = owner.prepare(decision)
        self.index = 0

    def process(self, doc: Document) -> Document | str:
        result = self.owner.apply(doc, self.index, self.decision)
        self.index += 1
        return result


def _nbytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", errors="surrogatepass"))
