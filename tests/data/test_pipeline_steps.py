"""The step contract and the dedup steps: batching, stats, examples, decisions across shards."""

import numpy as np
import pytest

from lmforge.data.documents import Document
from lmforge.data.pipeline.config import load_pipeline_config
from lmforge.data.pipeline.dedup_steps import ExactDedup, LineDedup, MinHashDedup
from lmforge.data.pipeline.step import Filter, Transform
from lmforge.errors import LmforgeError


class KeepShort(Filter):
    name = "keep_short"
    batch_size = 3

    def filter(self, doc):
        return len(doc.text) < 10 or (False, "too_long")


class Upper(Transform):
    name = "upper"
    drop_reason = "was_empty"

    def transform(self, doc):
        return Document(doc.id, doc.text.upper(), doc.meta) if doc.text != "-" else None


def _docs(*texts):
    return [Document(f"d{i}", t) for i, t in enumerate(texts)]


def test_filter_and_transform_own_stats_examples_and_progress():
    seen = []
    step = KeepShort()
    step.progress = lambda name, docs, nbytes: seen.append((name, docs, nbytes))
    kept = list(step(_docs("short", "a much longer text", "tiny", "x" * 20, "ok", "é")))
    assert [d.text for d in kept] == ["short", "tiny", "ok", "é"]
    s = step.stats
    assert (s.docs_in, s.docs_out, s.removed) == (6, 4, {"too_long": 2})
    assert s.bytes_in == 5 + 18 + 4 + 20 + 2 + 2 and s.bytes_out == 5 + 4 + 2 + 2
    assert [e["id"] for e in s.examples["too_long"]] == ["d1", "d3"]
    assert seen == [("keep_short", 3, 27), ("keep_short", 3, 24)]  # one report per batch
    upper = Upper()
    assert [d.text for d in upper(_docs("a", "-", "b"))] == ["A", "B"]
    assert upper.stats.removed == {"was_empty": 1}


def _run_global(step, shards):
    """Collect per shard, decide once, apply per shard, as the executor does."""
    packs = []
    for docs in shards:
        keys = []
        list(step.collect(docs, keys))
        packs.append(step.pack(keys))
    decisions = step.decide(packs)
    return [
        [d.id for d in step.applying(dec)(docs)]
        for docs, dec in zip(shards, decisions, strict=True)
    ]


def test_exact_dedup_keeps_the_first_copy_in_input_order_across_shards():
    shards = [_docs("a", "b", "a\n"), [Document("e0", "b"), Document("e1", "c")]]
    step = ExactDedup()
    assert _run_global(step, shards) == [["d0", "d1"], ["e1"]]
    assert step.stats.removed == {"duplicate": 2} and step.stats.counters["duplicate_groups"] == 2


def test_line_dedup_removes_every_copy_of_repeated_lines_exactly_and_with_bloom():
    boiler = "Copyright 2024 Example Corp. All rights reserved."
    shards = [
        _docs(f"First article text here.\n{boiler}\n", "ok\nshort\nshort\n"),
        [Document("e0", f"Second article, other words.\n{boiler}"), Document("e1", boiler)],
    ]
    for cfg in (LineDedup.Config(), LineDedup.Config(bloom_capacity=10_000, bloom_fp_rate=1e-6)):
        step = LineDedup(cfg)
        assert _run_global(step, shards) == [["d0", "d1"], ["e0"]]
        assert step.stats.removed == {"empty_after_line_dedup": 1}
        assert step.stats.counters["lines_removed"] == 3  # short lines are never removed


def test_minhash_dedup_finds_near_duplicates_across_shards_and_keeps_the_first():
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(5000)]
    base = [" ".join(rng.choice(vocab, 300)) for _ in range(6)]
    near = base[1].split()
    near[150] = "changed"
    shards = [_docs(*base[:3]), [Document("x", " ".join(near)), *_docs(*base[3:])]]
    step = MinHashDedup()
    assert _run_global(step, shards) == [["d0", "d1", "d2"], ["d0", "d1", "d2"]]
    assert step.stats.removed == {"near_duplicate": 1}
    assert step.stats.counters["clusters"] == 1 and step.stats.counters["lsh_bands"] == 9


def test_minhash_dedup_normalizes_and_takes_banding_from_its_config():
    rng = np.random.default_rng(1)
    base = " ".join(rng.choice([f"w{i}" for i in range(5000)], 300))
    spaced = base.replace(" ", "\u00a0", 150)  # half the spaces no-break
    shards = [_docs(base, spaced)]
    step = MinHashDedup()
    assert _run_global(step, shards) == [["d0"]]
    raw = MinHashDedup(MinHashDedup.Config(normalize=False))
    assert _run_global(raw, shards) == [["d0", "d1"]]  # "w1\u00a0w2" is one word
    cfg = load_pipeline_config(
        flags={"input": ["x"], "output": "y", "steps": ["minhash_dedup"]},
        overrides=[
            "minhash_dedup.bands=16",
            "minhash_dedup.rows=8",
            "minhash_dedup.normalization.strip_accents=false",
        ],
    )
    c = cfg.step_config["minhash_dedup"]
    assert (c.bands, c.rows, c.normalize, c.normalization.strip_accents) == (16, 8, True, False)
    chosen = MinHashDedup(c)
    assert _run_global(chosen, shards) == [["d0"]]
    assert (chosen.stats.counters["lsh_bands"], chosen.stats.counters["lsh_rows"]) == (16, 8)
    with pytest.raises(LmforgeError, match="minhash_dedup: bands=16 without the other"):
        MinHashDedup(MinHashDedup.Config(bands=16)).setup()
    with pytest.raises(LmforgeError, match="need more than 128 permutations"):
        MinHashDedup(MinHashDedup.Config(bands=16, rows=9)).setup()
