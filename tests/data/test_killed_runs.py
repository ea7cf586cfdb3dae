"""`lmforge data run` and `lmforge tokenize` SIGKILLed at random moments (tests/kills.py): the
same command then finishes with the shards of an uninterrupted run, byte for byte, and no file
under a final name is ever half written. The pipeline resumes after its finished tasks;
tokenizing starts its shards over, and its folder has no `meta.json` until they are whole."""

import json
import random
import shutil

import numpy as np
import pytest

from lmforge.tokenizer import train_bpe
from tests.kills import KILLS, assert_whole, kill_rng, lmforge, run_through_kills, timed_run

WORDS = " ".join(
    [
        "the a committee met on budget for town library reading room needs better lighting and",
        "children section should stay open later during summer rain closed mountain road farmers",
        "valley worried about hay water trucks market recipe loaf flour salt yeast museum railway",
    ]
).split()
TIMINGS = {"seconds", "docs_per_s", "mb_per_s"}


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """24 JSONL files of 60 documents of random words (some repeated: dedup has work)."""
    root = tmp_path_factory.mktemp("killed_in")
    rng = random.Random(0)
    for f in range(24):
        rows = []
        for i in range(60):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 200)))
            rows.append({"id": f"f{f}d{i}", "text": text.capitalize() + "."})
        rows[7]["text"] = rows[3]["text"]
        (root / f"part_{f:02d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _pipeline(documents, out):
    return lmforge(
        "data", "run", "--input", str(documents), "--output", str(out), "--steps",
        "quality,pii,exact_dedup,minhash_dedup", "--set", "read.shard_bytes=60000",
        "--set", "write.format=jsonl", "--workers", "1",
    )  # fmt: skip


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _stats(folder):
    def untimed(obj):
        if isinstance(obj, dict):
            return {k: untimed(v) for k, v in obj.items() if k not in TIMINGS | {"output"}}
        return [untimed(v) for v in obj] if isinstance(obj, list) else obj

    return untimed(json.loads((folder / "stats.json").read_text()))


def _assert_token_folder_whole(folder):
    """Whatever the kill left: no meta.json, or one whose shards match it."""
    assert_whole(folder)
    if not (folder / "meta.json").exists():
        return
    meta = json.loads((folder / "meta.json").read_text())
    itemsize = np.dtype(meta["dtype"]).itemsize
    for name, counts in meta["shards"].items():
        assert (folder / f"{name}.bin").stat().st_size == counts["tokens"] * itemsize
        assert (folder / f"{name}.idx").stat().st_size == counts["documents"] * 8


def test_killed_pipeline_and_tokenize_end_with_the_shards_of_an_unbroken_run(documents, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    spread = 0.8 * timed_run(_pipeline(documents, straight), straight) / KILLS
    log = run_through_kills(
        _pipeline(documents, killed), killed, KILLS, spread, kill_rng("data pipeline"),
        lambda: assert_whole(killed), reset=lambda: shutil.rmtree(killed),
    )  # fmt: skip
    assert sorted(_files(straight)) == sorted(_files(killed))
    same = _files(straight).keys() - {"summary.md"}  # its timings differ
    identical = all(_files(straight)[n] == _files(killed)[n] for n in same - {"stats.json"})
    identical = identical and _stats(straight) == _stats(killed)
    assert not (killed / ".work").exists() and not list(killed.glob("*.tmp"))
    log.summary("data pipeline", identical)
    assert log.kills >= 1 and identical

    tokenizer_dir = tmp_path / "tokenizer"
    texts = [json.loads(line)["text"] for line in (straight / "shard_00000.jsonl").open()]
    train_bpe(texts, vocab_size=300, workers=1).save(tokenizer_dir)

    def tokenize(out):
        return lmforge(
            "tokenize", "--tokenizer", str(tokenizer_dir), "--input", str(straight), "--out",
            str(out), "--workers", "1", "--val-fraction", "0.05",
        )  # fmt: skip

    tokens_straight, tokens_killed = tmp_path / "tokens", tmp_path / "tokens_killed"
    spread = 0.8 * timed_run(tokenize(tokens_straight), tokens_straight)
    log = run_through_kills(
        tokenize(tokens_killed), tokens_killed, KILLS, spread, kill_rng("tokenize"),
        lambda: _assert_token_folder_whole(tokens_killed),
        reset=lambda: shutil.rmtree(tokens_killed),
    )  # fmt: skip
    identical = _files(tokens_straight) == _files(tokens_killed)
    log.summary("tokenize", identical)
    assert log.kills >= 1 and identical
