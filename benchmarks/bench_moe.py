"""Mixture of experts against a dense model of equal active parameters, fp32 on this CPU.

Two models of the `small` preset's shape (4 layers, d 256, 4 heads, the corpus's vocabulary):
dense, whose SwiGLU MLP is d_ff wide (8/3 · d rounded up to 64: 704), and MoE, 8 experts top-2
each d_ff / 2 wide, so a token runs the same FFN parameters in both (the MoE adds its routers).
One process, batches of 8 × 256 tokens, AdamW, loss = cross-entropy (+ moe_losses for the MoE,
moe_aux_loss_coef 0.01). Three measurements:

1. Training tokens/s (forward + backward + AdamW step) of dense and MoE: --reps repetitions
   of --steps steps on one fixed training batch (lr 1e-4, so the models stay near their
   initialisation), the sides interleaved, one warm-up step each, medians. The MoE row is its
   default path (grouped mm where it works, as here); the loop's row is beside it.
   Target >= 0.75x.
2. Grouped mm vs the per-expert loop: the same MoE model, `use_grouped_mm` forced True, then
   False, on every GroupedExperts, interleaved with the sides of 1.
3. Validation loss after equal wall-clock: fresh models, each trained for --seconds of its own
   step time on the same sequence of random training windows, alternating step by step so
   that load from elsewhere on the machine falls on both; lr 3e-3 after a 20-step warm-up,
   cosine by the fraction of the budget used down to 10 %, the same for both. Then the mean
   cross-entropy of each over the same held-out batches (every non-overlapping window of the
   val split, at most --eval-windows of them).

Data: the speedrun's built-in corpus (the Python standard library's source, BPE 4096), prepared
once into the cache as `lmforge train` does, or a prepared shard folder (--shards DIR).
Threads: torch's default unless --threads. Writes benchmarks/results/moe.json (or --out PATH).

    python benchmarks/bench_moe.py [--reps 5] [--steps 4] [--seconds 120] [--quick]
        [--threads N] [--shards DIR] [--out PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lmforge.atomic import write_json
from lmforge.config import small
from lmforge.device.cpuinfo import cpu_class, read_cpuinfo
from lmforge.model import ModelConfig, Transformer
from lmforge.model.experts import GroupedExperts, grouped_mm_available
from lmforge.model.moe import moe_losses
from lmforge.tokens import get_batch, load_tokens, read_meta

RESULTS = Path(__file__).parent / "results" / "moe.json"
TARGET_RATIO = 0.75  # MoE training tokens/s over dense


@dataclasses.dataclass(frozen=True)
class Settings:
    d_model: int
    n_layers: int
    n_heads: int
    batch: int
    seq: int
    experts: int = 8
    top_k: int = 2
    aux_loss_coef: float = 0.01
    lr: float = 3e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1


FULL = Settings(d_model=256, n_layers=4, n_heads=4, batch=8, seq=256)
QUICK = Settings(d_model=64, n_layers=2, n_heads=2, batch=4, seq=64, warmup_steps=2)


def model_configs(s: Settings, vocab: int) -> dict[str, ModelConfig]:
    dense = ModelConfig(
        vocab_size=vocab,
        d_model=s.d_model,
        n_layers=s.n_layers,
        n_heads=s.n_heads,
        max_seq_len=s.seq,
    )
    moe = dataclasses.replace(
        dense,
        n_experts=s.experts,
        experts_per_token=s.top_k,
        moe_expert_d_ff=dense.ffn_dim // s.top_k,
        moe_aux_loss_coef=s.aux_loss_coef,
    )
    return {"dense": dense, "moe": moe}


def active_params(model: Transformer) -> int:
    """Parameters one token runs through: all, less the experts it is not routed to."""
    c = model.config
    idle = c.n_layers * (c.n_experts - c.experts_per_token) * 3 * c.d_model * c.expert_ffn_dim
    return model.num_params() - (idle if c.n_experts else 0)


def set_grouped_mm(model: nn.Module, use: bool | None) -> None:
    for m in model.modules():
        if isinstance(m, GroupedExperts):
            m.use_grouped_mm = use


def build(config: ModelConfig, lr: float, seed: int) -> tuple[Transformer, torch.optim.AdamW]:
    torch.manual_seed(seed)
    model = Transformer(config)
    return model, torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))


def train_step(model: Transformer, optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """One AdamW step on cross-entropy plus the MoE balance loss (0 for a dense model)."""
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    (loss + moe_losses(model)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


# -- 1 and 2: throughput -------------------------------------------------------------------


def throughput(
    configs: dict[str, ModelConfig], s: Settings, train: np.ndarray, reps: int, steps: int
) -> dict[str, float]:
    """Median training tokens/s of each side: dense, and the MoE on each expert backend."""
    x, y = get_batch(train, s.batch, s.seq, rng=np.random.default_rng(0))
    # A small lr keeps the models near their initialisation over the repeated batch.
    dense, moe = build(configs["dense"], 1e-4, 0), build(configs["moe"], 1e-4, 0)
    sides = {"dense": (dense, None), "moe_loop": (moe, False)}
    if grouped_mm_available("cpu", torch.float32):
        sides["moe_grouped"] = (moe, True)

    def rate(name: str, n: int) -> float:
        (model, optimizer), use = sides[name]
        set_grouped_mm(model, use)
        start = time.perf_counter()
        for _ in range(n):
            train_step(model, optimizer, x, y)
        return n * s.batch * s.seq / (time.perf_counter() - start)

    for name in sides:
        rate(name, 1)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(reps):
        for name in sides:
            rates[name].append(rate(name, steps))
    set_grouped_mm(moe[0], None)
    return {name: statistics.median(values) for name, values in rates.items()}


# -- 3: validation loss after equal wall-clock ----------------------------------------------


def lr_at(s: Settings, step: int, used: float) -> float:
    """Linear warm-up over steps, then cosine over the fraction of the time budget used."""
    warm = min(1.0, (step + 1) / s.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(used, 1.0)))
    return s.lr * warm * (s.min_lr_ratio + (1 - s.min_lr_ratio) * cosine)


def train_for(
    configs: dict[str, ModelConfig], s: Settings, train: np.ndarray, seconds: float
) -> dict[str, dict]:
    """Train each model for `seconds` of its own step time, alternating step by step."""
    runs = {}
    for name, config in configs.items():
        model, optimizer = build(config, s.lr, 1)
        runs[name] = {
            "model": model,
            "optimizer": optimizer,
            "rng": np.random.default_rng(1),
            "seconds": 0.0,
            "steps": 0,
            "losses": [],
        }
    while any(r["seconds"] < seconds for r in runs.values()):
        for r in runs.values():
            if r["seconds"] >= seconds:
                continue
            start = time.perf_counter()
            x, y = get_batch(train, s.batch, s.seq, rng=r["rng"])
            for group in r["optimizer"].param_groups:
                group["lr"] = lr_at(s, r["steps"], r["seconds"] / seconds)
            r["losses"].append(train_step(r["model"], r["optimizer"], x, y))
            r["steps"] += 1
            r["seconds"] += time.perf_counter() - start
    return runs


@torch.no_grad()
def val_loss(model: Transformer, val: np.ndarray, s: Settings, windows: int) -> float:
    """Mean cross-entropy (nats/token) over the first `windows` non-overlapping windows of
    `val`, in batches of s.batch."""
    model.eval()
    starts = np.arange(0, len(val) - s.seq, s.seq)[:windows]
    total, count = 0.0, 0
    for i in range(0, len(starts), s.batch):
        w = np.stack(
            [np.asarray(val[j : j + s.seq + 1], dtype=np.int64) for j in starts[i : i + s.batch]]
        )
        x, y = torch.from_numpy(w[:, :-1]), torch.from_numpy(w[:, 1:])
        total += F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    model.train()
    return total / count


# -- the run ----------------------------------------------------------------------------------


def load_data(shards: str | None) -> tuple[str, np.ndarray, np.ndarray, int]:
    """(shard folder, train ids, val ids, vocabulary): --shards, else the built-in corpus."""
    if shards is None:
        from lmforge.prepare import prepare_corpus
        from lmforge.speedrun import cache_root

        cfg = small()
        shards = str(prepare_corpus(cfg.data, cfg.tokenizer, cache_root(cfg)).shard_dir)
    meta = read_meta(shards)
    return shards, load_tokens(shards, "train"), load_tokens(shards, "val"), meta.vocab_size


def table_rows(rates: dict, runs: dict, quality: dict, seconds: float) -> list[dict]:
    """The comparison, one dict per row: the dense value, the MoE's, their ratio, a target."""

    def row(name, dense, moe, target=None, met=None):
        return {
            "row": name,
            "dense": dense,
            "moe": moe,
            "ratio": round(moe / dense, 4),
            "target": target,
            "met": met,
        }

    ratio = rates["moe"] / rates["dense"]
    d, m = (runs[k]["model"] for k in ("dense", "moe"))
    dq, mq = quality["dense"], quality["moe"]
    return [
        row("parameters, total", d.num_params(), m.num_params()),
        row("parameters, active per token", active_params(d), active_params(m), "equal"),
        row(
            "training tokens/s",
            rates["dense"],
            rates["moe"],
            f">= {TARGET_RATIO}x",
            ratio >= TARGET_RATIO,
        ),
        row(
            "training tokens/s, experts on the per-expert loop",
            rates["dense"],
            rates["moe_loop"],
        ),
        row(f"steps in {seconds:g} s", dq["steps"], mq["steps"]),
        row(
            f"val loss after {seconds:g} s (nats/token)",
            dq["val_loss"],
            mq["val_loss"],
            "MoE lower",
            mq["val_loss"] < dq["val_loss"],
        ),
    ]


def print_tables(rows: list[dict], rates: dict) -> None:
    print()
    print("| row | dense | MoE, 8 experts top-2 | MoE / dense | target |")
    print("|---|---|---|---|---|")
    for r in rows:
        target = "" if r["target"] is None else r["target"]
        if r["met"] is not None:
            target += ": met" if r["met"] else ": NOT met"
        cells = [
            f"{v:,.4f}" if isinstance(v, float) and v < 100 else f"{v:,.0f}"
            for v in (r["dense"], r["moe"])
        ]
        print(f"| {r['row']} | {cells[0]} | {cells[1]} | {r['ratio']:.3f}x | {target} |")
    print()
    print("| MoE experts | training tokens/s | vs per-expert loop |")
    print("|---|---|---|")
    print(f"| per-expert loop | {rates['moe_loop']:,.0f} | 1.00x |")
    if "moe_grouped" in rates:
        speedup = rates["moe_grouped"] / rates["moe_loop"]
        print(f"| grouped mm (the default here) | {rates['moe_grouped']:,.0f} | {speedup:.2f}x |")
    else:
        print("| grouped mm | unavailable in this torch | |")


def evaluate(runs: dict, val: np.ndarray, s: Settings, windows: int) -> dict:
    quality = {}
    for name, r in runs.items():
        quality[name] = {
            "val_loss": round(val_loss(r["model"], val, s, windows), 4),
            "train_loss_last10": round(statistics.mean(r["losses"][-10:]), 4),
            "steps": r["steps"],
            "tokens": r["steps"] * s.batch * s.seq,
            "train_s": round(r["seconds"], 2),
        }
    quality["moe_lower"] = quality["moe"]["val_loss"] < quality["dense"]["val_loss"]
    return quality


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, help="throughput repetitions (5; --quick 1)")
    parser.add_argument("--steps", type=int, help="steps per repetition (4; --quick 1)")
    parser.add_argument("--seconds", type=float, help="training budget per model (120; --quick 1)")
    parser.add_argument("--eval-windows", type=int, help="held-out windows at most (384; 32)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test")
    parser.add_argument("--shards", help="a prepared token shard folder with train and val")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    reps = args.reps or (1 if args.quick else 5)
    steps = args.steps or (1 if args.quick else 4)
    seconds = args.seconds or (1.0 if args.quick else 120.0)
    windows = args.eval_windows or (32 if args.quick else 384)
    if args.threads:
        torch.set_num_threads(args.threads)
    began = time.perf_counter()

    shard_dir, train, val, vocab = load_data(args.shards)
    configs = model_configs(s, vocab)
    rates = {name: round(v, 1) for name, v in throughput(configs, s, train, reps, steps).items()}
    rates["moe"] = rates.get("moe_grouped", rates["moe_loop"])  # the path MoE takes by default
    runs = train_for(configs, s, train, seconds)
    quality = evaluate(runs, val, s, windows)
    rows = table_rows(rates, runs, quality, seconds)
    print_tables(rows, rates)

    info = read_cpuinfo()
    settings = {
        **dataclasses.asdict(s),
        "reps": reps,
        "steps": steps,
        "seconds": seconds,
        "eval_windows": windows,
        "dtype": "float32",
        "optimizer": "AdamW, betas (0.9, 0.95), weight decay 0.01",
        "schedule": "linear warm-up, then cosine by the fraction of the budget used",
    }
    out = {
        "cpu": f"{info.model} ({cpu_class(info)})",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "quick": args.quick,
        "settings": settings,
        "data": {
            "shards": shard_dir,
            "vocab": vocab,
            "train_tokens": len(train),
            "val_tokens": len(val),
        },
        "models": {
            name: {"d_ff": c.expert_ffn_dim, "n_experts": c.n_experts}
            for name, c in configs.items()
        },
        "rows": rows,
        "tokens_per_s": rates,
        "grouped_speedup": (
            round(rates["moe_grouped"] / rates["moe_loop"], 4) if "moe_grouped" in rates else None
        ),
        "quality": quality,
        "wall_s": round(time.perf_counter() - began, 1),
    }
    write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
