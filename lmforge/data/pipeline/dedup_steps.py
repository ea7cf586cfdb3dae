"""The deduplication steps: exact documents, repeated lines, near-duplicates (MinHash + LSH).

Each is a `GlobalStep`: workers compute per-document keys on their shards, `decide` runs once
over all shards in order (the first occurrence in input order is the one kept, so the result
does not depend on how inputs were sharded or how many workers ran), and workers apply it.
The algorithms live in `lmforge.data.dedup`, `line_dedup`, `minhash` and `lsh`; these classes
only move their keys and decisions between shards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmforge.data.documents import Document
from lmforge.data.pipeline.step import Arrays, GlobalStep
from lmforge.data.shingle_text import TextNormalizer


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


class MinHashDedup(GlobalStep):
    """Near-duplicates: MinHash signatures, LSH candidates, true Jaccard, union-find clusters.

    Shingles come from normalized text (`normalize.TextNormalizer`) unless `normalize = false`;
    `[minhash_dedup.normalization]` turns single steps off (e.g. `strip_accents = false`).
    """

    name = "minhash_dedup"
    batch_size = 1024

    @dataclass
    class Config:
        threshold: float = 0.8  # Jaccard similarity of word n-gram shingle sets
        num_perm: int = 128
        ngram: int = 5
        seed: int = 1
        verify: str = "jaccard"  # jaccard (true similarity), signature (estimate) or none
        normalize: bool = True  # shingle normalized text (the steps below), or the raw text
        normalization: TextNormalizer = field(default_factory=TextNormalizer)  # each step on/off
        bands: int = 0  # LSH bands x rows (both, <= num_perm); 0 and 0: chosen for threshold
        rows: int = 0

    def setup(self) -> None:
        from lmforge.data.minhash import MinHasher

        c = self.config
        self.index()  # a bad banding fails here, in every worker, before any hashing
        self.hasher = MinHasher(
            num_perm=c.num_perm,
            ngram=c.ngram,
            seed=c.seed,
            normalize=c.normalization if c.normalize else None,
        )

    def index(self):
        """The LSH index of the configured banding; LmforgeError naming the setting if invalid."""
        from lmforge.data.lsh import LSHIndex
        from lmforge.data.near_dedup import VERIFY_MODES
        from lmforge.errors import LmforgeError

        c = self.config
        if c.verify not in VERIFY_MODES:
            raise LmforgeError(
                f"minhash_dedup.verify {c.verify!r} is unknown: use {', '.join(VERIFY_MODES)}"
            )
        try:
            return LSHIndex(
                threshold=c.threshold,
                num_perm=c.num_perm,
                bands=c.bands or None,
                rows=c.rows or None,
            )
        except ValueError as e:
            raise LmforgeError(f"minhash_dedup: {e} (0 and 0: automatic)") from e

    def keys(self, docs: list[Document]) -> list[Any]:
        from lmforge.data.near_dedup import sorted_set

        texts = [doc.text for doc in docs]
        keys: list[Any] = []
        for lo, hi in self.hasher.groups(texts):  # groups of a few hundred KB hash fastest
            grams, offsets = self.hasher.shingles(texts[lo:hi])
            signatures = self.hasher.signatures_of_shingles(grams, offsets)
            for i, sig in enumerate(signatures):
                jaccard = self.config.verify == "jaccard"
                keys.append(
                    (sig, sorted_set(grams[offsets[i] : offsets[i + 1]]) if jaccard else None)
                )
        return keys

    def pack(self, keys: list[Any]) -> Arrays:
        signatures = np.zeros((len(keys), self.config.num_perm), dtype=np.uint32)
        for i, (sig, _) in enumerate(keys):
            signatures[i] = sig
        sets = [s for _, s in keys if s is not None]
        offsets = np.zeros(len(sets) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in sets], out=offsets[1:])
        shingles = np.concatenate(sets) if sets else np.zeros(0, dtype=np.uint64)
        return {"signatures": signatures, "shingles": shingles, "offsets": offsets}

    def decide(self, shards: list[Arrays]) -> list[Arrays]:
        from lmforge.data.near_dedup import clusters_from_pairs, jaccard

        c = self.config
        index = self.index()
        print(index.describe())
        sizes = [len(s["signatures"]) for s in shards]
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        signatures = np.concatenate([s["signatures"] for s in shards] or [np.zeros((0, 1))])
        pairs = index.candidate_pairs(signatures) if len(signatures) else np.zeros((0, 2), int)

        def shingle_set(i: int) -> np.ndarray:
            shard = int(np.searchsorted(starts, i, side="right")) - 1
            k, arrays = i - starts[shard], shards[shard]
            return arrays["shingles"][arrays["offsets"][k] : arrays["offsets"][k + 1]]

        if c.verify == "jaccard":
            ok = [jaccard(shingle_set(i), shingle_set(j)) >= c.threshold for i, j in pairs.tolist()]
            verified = pairs[np.array(ok, dtype=bool)] if len(pairs) else pairs
        elif c.verify == "signature":
            agree = (signatures[pairs[:, 0]] == signatures[pairs[:, 1]]).mean(axis=1)
            verified = pairs[agree >= c.threshold]
        else:
            verified = pairs
        clusters = clusters_from_pairs(verified)
        drop = np.zeros(len(signatures), dtype=bool)
        for cluster in clusters:
            drop[cluster[1:]] = True  # the first in input order stays
        for key, n in (
            ("lsh_bands", index.bands),
            ("lsh_rows", index.rows),
            ("candidate_pairs", len(pairs)),
            ("verified_pairs", len(verified)),
            ("clusters", len(clusters)),
            ("documents_in_clusters", sum(map(len, clusters))),
        ):
            self.stats.count(key, int(n))
        return [{"drop": drop[starts[s] : starts[s + 1]]} for s in range(len(shards))]

    def apply(self, doc: Document, index: int, decision: Arrays) -> Document | str:
        return "near_duplicate" if decision["drop"][index] else doc


class LineDedup(GlobalStep):
    """Removes every copy of lines that occur more than once in the corpus (`line_dedup`)."""

    name = "line_dedup"

    @dataclass
    class Config:
        min_chars: int = 10  # shorter lines (after stripping) are never counted nor removed
        bloom_capacity: int = 0  # > 0: count in Bloom filters sized for this many lines
        bloom_fp_rate: float = 0.001

    def keys(self, docs: list[Document]) -> list[Any]:
        from lmforge.data.bloom import item_hashes

        keys = []
        for doc in docs:
            lines = (line.strip() for line in doc.text.splitlines())
            keys.append(item_hashes([x for x in lines if len(x) >= self.config.min_chars]))
        return keys

    def pack(self, keys: list[Any]) -> Arrays:
        h1 = np.concatenate([k[0] for k in keys] or [np.zeros(0, np.uint64)])
        if not self.config.bloom_capacity:
            return {"lines": h1}
        h2 = np.concatenate([k[1] for k in keys] or [np.zeros(0, np.uint64)])
        seen, twice = self._blooms()
        twice.add_hashes(*_select(seen.add_hashes(h1, h2), h1, h2))
        return {**seen.to_arrays("seen_"), **twice.to_arrays("twice_")}

    def decide(self, shards: list[Arrays]) -> list[Arrays]:
        from lmforge.data.bloom import BloomFilter

        if not self.config.bloom_capacity:
            lines = np.concatenate([s["lines"] for s in shards] or [np.zeros(0, np.uint64)])
            keys, counts = np.unique(lines, return_counts=True)
            repeated = {"keys": keys[counts > 1]}
            self.stats.count("distinct_repeated_lines", len(repeated["keys"]))
            return [repeated] * len(shards)
        seen, twice = self._blooms()
        for s in shards:  # merged as `LineCounter.merge` does
            other_seen = BloomFilter.from_arrays(s, "seen_")
            twice = twice | BloomFilter.from_arrays(s, "twice_") | (seen & other_seen)
            seen = seen | other_seen
        return [twice.to_arrays("twice_")] * len(shards)

    def prepare(self, decision: Arrays) -> Any:
        from lmforge.data.bloom import BloomFilter
        from lmforge.data.line_dedup import LineDedup as Remover

        if "keys" in decision:
            return Remover(self.config.min_chars, keys=decision["keys"])
        return Remover(self.config.min_chars, bloom=BloomFilter.from_arrays(decision, "twice_"))

    def apply(self, doc: Document, index: int, decision: Any) -> Document | str:
        before = decision.removed_lines
        text = decision.apply(doc.text)
        if decision.removed_lines == before:
            return doc
        self.stats.count("lines_removed", decision.removed_lines - before)
        return Document(doc.id, text, doc.meta) if text.strip() else "empty_after_line_dedup"

    def _blooms(self):
        from lmforge.data.bloom import BloomFilter

        c = self.config
        return BloomFilter(c.bloom_capacity, c.bloom_fp_rate), BloomFilter(
            c.bloom_capacity, c.bloom_fp_rate
        )


def _select(mask: np.ndarray, *arrays: np.ndarray) -> list[np.ndarray]:
    return [a[mask] for a in arrays]
