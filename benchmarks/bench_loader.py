"""Benchmark: time the training loop waits on TokenLoader, next to the training step it feeds.

One run measures, side by side, a training step of the `small` preset's model (d_model 256,
4 layers, batch 16 x 256, AdamW) and the time `next_batch` blocks that loop, with the loader
synchronous (prefetch=0) and with its background thread (prefetch=2), and as the reference the
same loop on one batch made in advance (no loader at all), over interleaved repetitions.
The data is two synthetic token-shard datasets blended 70/30 with document segments on, the
loader's most expensive configuration. Prints a table and writes benchmarks/results/loader.json.

    .venv/bin/python benchmarks/bench_loader.py [--steps 10] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lmforge.atomic import write_json
from lmforge.model import ModelConfig, Transformer
from lmforge.tokens import DataSource, ShardMeta, TokenLoader, token_dtype, write_meta, write_shard

VOCAB, BATCH, SEQ = 4096, 16, 256
TARGET_SHARE = 0.02
MODES = ("reference", "sync", "prefetch")
RESULTS = Path(__file__).parent / "results" / "loader.json"


def synthetic_shard(path: Path, n_tokens: int, seed: int) -> Path:
    """Random ids cut into documents of 50-2000 tokens; the loader's cost ignores the values."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, n_tokens, dtype=np.int64)
    cuts = np.cumsum(rng.integers(50, 2000, n_tokens // 50))
    docs = np.split(ids, cuts[cuts < n_tokens])
    counts = write_shard(path, "train", docs, VOCAB)
    write_meta(path, ShardMeta(token_dtype(VOCAB).str, VOCAB, "synthetic", {"train": counts}))
    return path


def train_step(model: Transformer, optimizer: torch.optim.Optimizer, x, y) -> None:
    loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(next_batch, model, optimizer, steps: int) -> dict:
    """Per-step milliseconds spent waiting in next_batch, training, and in the whole iteration."""
    x, y, _ = next_batch()
    train_step(model, optimizer, x, y)  # warm-up: thread start, first pages, allocator
    wait = work = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y, _ = next_batch()
        t1 = time.perf_counter()
        train_step(model, optimizer, x, y)
        t2 = time.perf_counter()
        wait, work = wait + t1 - t0, work + t2 - t1
    return {
        "loader_ms": 1e3 * wait / steps,
        "step_ms": 1e3 * work / steps,
        "iteration_ms": 1e3 * (wait + work) / steps,
        "share": wait / (wait + work),
    }


def measure_mode(mode: str, sources, model, optimizer, steps: int) -> dict:
    """`reference` trains on one batch made in advance; the others draw from a TokenLoader."""
    prefetch = {"sync": 0, "prefetch": 2}.get(mode, 0)
    with TokenLoader(sources, BATCH, SEQ, seed=0, prefetch=prefetch, segments=True) as loader:
        if mode == "reference":
            fixed = loader.next_batch()
            return measure(lambda: fixed, model, optimizer, steps)
        return measure(loader.next_batch, model, optimizer, steps)


def loader_alone(sources, batches: int) -> float:
    """Milliseconds to produce one batch with nothing else running (no prefetch)."""
    with TokenLoader(sources, BATCH, SEQ, seed=1, prefetch=0, segments=True) as loader:
        loader.next_batch()
        t0 = time.perf_counter()
        for _ in range(batches):
            loader.next_batch()
        return 1e3 * (time.perf_counter() - t0) / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per repetition")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each mode")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(vocab_size=VOCAB, d_model=256, n_layers=4, n_heads=4, max_seq_len=SEQ)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with tempfile.TemporaryDirectory() as tmp:
        sources = [
            DataSource(synthetic_shard(Path(tmp) / "web", 4_000_000, 1), weight=0.7),
            DataSource(synthetic_shard(Path(tmp) / "code", 2_000_000, 2), weight=0.3),
        ]
        alone_ms = statistics.median(loader_alone(sources, 50) for _ in range(args.reps))
        runs = [
            {"mode": mode, "rep": rep, **measure_mode(mode, sources, model, optimizer, args.steps)}
            for rep in range(args.reps)
            for mode in MODES  # interleaved, so every mode sees the same machine load
        ]

    summary = {}
    print(f"{'mode':<10}{'wait ms/batch':>14}{'step ms':>10}{'iteration ms':>14}{'wait share':>12}")
    for mode in MODES:
        rows = [r for r in runs if r["mode"] == mode]
        med = {
            k: statistics.median(r[k] for r in rows) for k in rows[0] if k not in ("mode", "rep")
        }
        summary[mode] = med
        print(
            f"{mode:<10}{med['loader_ms']:>14.3f}{med['step_ms']:>10.1f}"
            f"{med['iteration_ms']:>14.1f}{100 * med['share']:>11.2f}%"
        )
    share = summary["prefetch"]["share"]
    verdict = "meets" if share < TARGET_SHARE else "misses"
    ref = [r["iteration_ms"] for r in runs if r["mode"] == "reference"]
    spread = (max(ref) - min(ref)) / statistics.median(ref)
    base = summary["reference"]["iteration_ms"]
    print(
        f"loader alone: {alone_ms:.3f} ms/batch; with prefetch the loop waits "
        f"{100 * share:.2f}% of its iteration time ({verdict} the < {100 * TARGET_SHARE:.0f}% "
        "target)"
    )
    print(
        f"iteration time vs reference: sync {summary['sync']['iteration_ms'] / base:.3f}x, "
        f"prefetch {summary['prefetch']['iteration_ms'] / base:.3f}x (reference varies "
        f"{100 * spread:.0f}% between repetitions; smaller differences are noise)"
    )
    write_json(
        RESULTS,
        {
            "benchmark": "loader",
            "setup": {
                "model": "small preset shape: d_model 256, 4 layers, 4 heads, vocab 4096",
                "batch_size": BATCH,
                "seq_len": SEQ,
                "datasets": "2 synthetic shards (4M, 2M tokens) blended 0.7/0.3, segments on",
                "steps": args.steps,
                "reps": args.reps,
                "torch_threads": torch.get_num_threads(),
                "cpus": os.cpu_count(),
                "machine": platform.processor() or platform.machine(),
                "torch": torch.__version__,
            },
            "loader_alone_ms": alone_ms,
            "reference_spread": spread,
            "summary": summary,
            "runs": runs,
            "target_share": TARGET_SHARE,
        },
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
