"""Per-step statistics: documents and bytes in and out, removals by reason with examples, counters.

A `StepStats` is filled by one step on one shard; shards' stats merge into the pipeline's. Every
field is plain data, so stats travel as JSON between worker processes, Ray tasks and disk.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

MAX_EXAMPLES = 3  # removed documents kept per reason
EXAMPLE_CHARS = 240


@dataclass
class StepStats:
    name: str
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    removed: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[dict]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    def remove(self, reason: str, doc_id: str = "", text: str = "") -> None:
        self.removed[reason] = self.removed.get(reason, 0) + 1
        kept = self.examples.setdefault(reason, [])
        if len(kept) < MAX_EXAMPLES:
            kept.append({"id": doc_id, "text": text[:EXAMPLE_CHARS]})

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def merge(self, other: StepStats) -> StepStats:
        """Add `other` (a later shard) into this one; examples keep the earliest."""
        self.docs_in += other.docs_in
        self.docs_out += other.docs_out
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out
        self.seconds += other.seconds
        for reason, n in other.removed.items():
            self.removed[reason] = self.removed.get(reason, 0) + n
        for reason, examples in other.examples.items():
            kept = self.examples.setdefault(reason, [])
            kept.extend(examples[: MAX_EXAMPLES - len(kept)])
        for key, n in other.counters.items():
            self.counters[key] = self.counters.get(key, 0) + n
        return self

    def to_dict(self) -> dict:
        out = asdict(self)
        out["docs_per_s"] = round(self.docs_in / self.seconds, 1) if self.seconds else None
        out["mb_per_s"] = round(self.bytes_in / 1e6 / self.seconds, 2) if self.seconds else None
        return out

    @classmethod
    def from_dict(cls, obj: dict) -> StepStats:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in obj.items() if k in names})


def merge_all(per_shard: list[list[StepStats]]) -> list[StepStats]:
    """Merge lists of step stats (one list per shard, steps in the same order)."""
    if not per_shard:
        return []
    total = [StepStats(s.name) for s in per_shard[0]]
    for stats in per_shard:
        for acc, s in zip(total, stats, strict=True):
            acc.merge(s)
    return total


@dataclass
class ReadStats:
    """What reading documents saw: files, documents, bytes, and files skipped as not UTF-8."""

    files: int = 0
    skipped_not_utf8: int = 0
    documents: int = 0
    bytes: int = 0
