"""The deduplication steps: exact documents, repeated lines, near-duplicates (MinHash + LSH).

Each is a `GlobalStep`: workers compute per-document keys on their shards, `decide` runs once
over all shards in order (the first occurrence in input order is the one kept, so the result
does not depend on how inputs were sharded or how many workers ran), and workers apply it.
The algorithms live in `lmforge.data.dedup`, `line_dedup`, `minhash` and `lsh`; these classes
only move their keys and decisions between shards.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmforge.data.documents import Document
from lmforge.data.pipeline.step import Arrays, GlobalStep


class ExactDedup(GlobalStep):
    """Drops documents whose normalized text (`dedup.normalize`) appeared earlier."""

    name = "exact_dedup"

    def keys(self, docs: list[Document]) -> list[Any]:
        from lmforge.data.dedup import text_hash

        return [text_hash(doc.text) for doc in docs]

    def pack(self, keys: list[Any]) -> Arrays:
        return {"hashes": np.array(keys, dtype=np.bytes_) if keys else np.zeros(0, "S16")}

    def decide(self, shards: list[Arrays]) -> list[Arrays]:
        seen: dict[bytes, int] = {}
        decisions = []
        for shard in shards:
            drop = np.zeros(len(shard["hashes"]), dtype=bool)
            for i, key in enumerate(shard["hashes"].tolist()):
                seen[key] = seen.get(key, 0) + 1
                drop[i] = seen[key] > 1
            decisions.append({"drop": drop})
        self.stats.count("duplicate_groups", sum(1 for n in seen.values() if n > 1))
        return decisions

    def apply(self, doc: Document, index: int, decision: Arrays) -> Document | str:
        return "duplicate" if decision["drop"][index] else doc
