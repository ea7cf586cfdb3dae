"""Training recipes at an equal wall-clock budget: nanoGPT's, nanochat's and lmforge's own.

Three recipes train on the speedrun's prepared data (the built-in corpus, vocabulary 4096), each
for the same wall-clock budget on this machine, interleaved, for a number of repetitions:

(a) nanoGPT: its model.py and train.py recipe at the shape its README gives a CPU, max_iters
    (= lr_decay_iters) fitted to the budget (reference_recipes/nanogpt.py says what it keeps);
(b) nanochat: its GPT and base_train.py recipe (Muon + AdamW) with runs/runcpu.sh's settings
    (depth 6, 16,384-token batches), --num-iterations fitted to the budget as runcpu.sh's user
    would (reference_recipes/nanochat.py);
(c) lmforge: `lmforge train --minutes M --out DIR --fresh --set train.eval.every=0`, sized by
    itself, in a subprocess. Its clock (`clock_s`, the seconds its checkpoint records) runs from
    the command's start to its last step: start-up, data loading, thread trial and sizing
    included, as the references' clocks run from building the model to their last step. Its
    wall time (`wall_s`) is the whole subprocess's, Python's start-up and teardown and its
    closing validation included too; both are reported.

Fitting (a) and (b) to the budget, as a user would: the clock starts before the model is
built; the first 2 steps are untimed, the next 5 timed, and their mean fixes the step count
that fits the rest of the budget; the run then trains until that count or the budget, whichever
comes first. Before the count is fixed the schedules use the recipe's own (nanoGPT's 2000,
nanochat's ratio-derived count); both are still warming up then, so nothing depends on it.
Both references compute in one precision, `reference_dtype`: bf16 autocast where lmforge
measures bf16 fast on this CPU, else fp32; lmforge uses its preset's precision=auto, the same
rule. Threads: torch's default for the references, lmforge's own choice, unless --threads.

Every final model is scored by one evaluator, `bits_per_byte`: non-overlapping windows of the
model's own context length over the whole validation split, fp32, no grad, summed nats / ln 2
over the summed UTF-8 bytes of the predicted tokens, predictions of special tokens counted in
neither sum (lmforge.train.bpb.evaluate's definition).

The time to reach (a)'s final bpb: (c) also trains at half the budget, and so does (b) when its
full-budget run reached (a)'s bpb at all (else it needs more than (a)'s time); a half-budget run
whose final bpb is at most (a)'s full-budget bpb reached it in at most half (a)'s time (a
decaying schedule is only at its best at its end, so this, not a point on the curve of the full
run, is the honest measurement), on a clock that ran at most half of (a)'s. Order per
repetition: a, b, c, b_half, c_half.

Targets: lmforge's bpb the lowest of the three; lmforge reaching nanoGPT's final bpb in at most
0.5x its time (c_half's bpb <= a's). Writes benchmarks/results/bench_recipe.json.

    python benchmarks/bench_recipe.py [--minutes 5] [--reps 2] [--out PATH] [--threads N]
        [--lmforge-args '--preset small']
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from reference_recipes import nanochat, nanogpt, random_batch
from torch import nn

from lmforge.atomic import write_json
from lmforge.config import small
from lmforge.device.cpuinfo import read_cpuinfo
from lmforge.prepare import prepare_corpus
from lmforge.speedrun import cache_root
from lmforge.tokenizer import Tokenizer
from lmforge.tokens import load_tokens, read_meta
from lmforge.train.bpb import token_byte_lengths
from lmforge.train.checkpoint import load_checkpoint
from lmforge.train.checkpoint_dir import list_checkpoints
from lmforge.train.precision import auto_precision

RESULTS = Path(__file__).parent / "results" / "bench_recipe.json"
UNTIMED_STEPS, TIMED_STEPS = 2, 5  # before a reference fixes its step count
NANOCHAT_DEPTH = 6  # runs/runcpu.sh's --depth: nanochat's own CPU configuration
EVAL_BATCH = 16  # windows per forward in the evaluator
ORDER = ("nanoGPT", "nanochat", "lmforge", "nanochat_half", "lmforge_half")


def reference_dtype() -> torch.dtype | None:
    """The one precision of both references: bf16 (autocast) where lmforge's precision=auto
    would pick it on this CPU, else None (fp32)."""
    return torch.bfloat16 if auto_precision(torch.device("cpu")) == "bf16" else None


@torch.no_grad()
def bits_per_byte(
    model: nn.Module,
    tokens: np.ndarray,
    byte_lengths: np.ndarray,
    context: int,
    batch_size: int = EVAL_BATCH,
) -> dict:
    """Bits per byte of `model` (ids (B, T) -> logits (B, T, V)) over every non-overlapping
    window of `context` tokens (plus the one it predicts last) of `tokens`, in fp32."""
    was_training = model.training
    model.eval()
    starts = np.arange(0, len(tokens) - context, context)
    lengths = torch.from_numpy(np.asarray(byte_lengths, dtype=np.int64))
    nats, n_bytes, n_tokens = 0.0, 0, 0
    for i in range(0, len(starts), batch_size):
        window = np.stack(
            [np.asarray(tokens[s : s + context + 1]) for s in starts[i : i + batch_size]]
        )
        window = torch.from_numpy(window.astype(np.int64))
        x, y = window[:, :-1], window[:, 1:].flatten()
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y, reduction="none")
        counted = lengths[y] > 0
        nats += float(loss[counted].double().sum())
        n_bytes += int(lengths[y].sum())
        n_tokens += int(counted.sum())
    model.train(was_training)
    return {
        "bpb": nats / math.log(2) / n_bytes,
        "loss": nats / n_tokens,
        "tokens": n_tokens,
        "bytes": n_bytes,
        "windows": len(starts),
        "context": context,
    }


def train_within(make, seconds: float, train_tokens: np.ndarray, seed: int) -> dict:
    """Build a reference run with `make()` and train it for at most `seconds` of wall clock:
    2 untimed steps, 5 timed ones that fix the step count the rest of the budget holds, then
    on to that count or the end of the budget."""
    start = time.perf_counter()
    run = make()
    generator = torch.Generator().manual_seed(10_000 + seed)

    def batch():
        return random_batch(train_tokens, run.batch_size, run.context, generator)

    step, planned, timed, losses = 0, None, [], []
    while (planned is None or step < planned) and time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        losses.append(run.step(step, batch))
        step += 1
        if planned is None and step > UNTIMED_STEPS:
            timed.append(time.perf_counter() - t0)
            if len(timed) == TIMED_STEPS:
                left = seconds - (time.perf_counter() - start)
                planned = step + max(int(left / statistics.mean(timed)), 0)
                run.set_iterations(planned)
    wall = time.perf_counter() - start
    return {
        "run": run,
        "steps": step,
        "planned_steps": planned,
        "wall_s": round(wall, 2),
        "step_s": round(statistics.mean(timed), 4) if timed else None,
        "first_loss": round(losses[0], 4) if losses else None,
        "last_loss": round(losses[-1], 4) if losses else None,
    }


def _beat(runs: list[dict], recipe: str, other: str, rep: int) -> bool:
    """Whether `recipe`'s full-budget bpb in repetition `rep` was at most `other`'s."""
    bpb = {r["recipe"]: r["eval"]["bpb"] for r in runs if r["rep"] == rep}
    return bpb[recipe] <= bpb[other]


def params_of(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors once


def run_reference(recipe, seconds, data, seed, dtype, **build) -> dict:
    out = train_within(
        lambda: recipe.build(data["vocab"], seed=seed, dtype=dtype, **build),
        seconds,
        data["train"],
        seed,
    )
    run = out.pop("run")
    out.update(
        params=params_of(run.model),
        tokens=out["steps"] * run.batch_size * run.context * getattr(run, "accum", 1),
        config=run.describe(),
        eval=bits_per_byte(run.model, data["val"], data["byte_lengths"], run.context),
    )
    return out


def run_lmforge(
    minutes: float, work: Path, data: dict, threads: int | None, extra: list[str]
) -> dict:
    """`lmforge train` for `minutes` in a subprocess, its newest checkpoint evaluated here."""
    out_dir = work / "run"
    command = [sys.executable, "-m", "lmforge", "train", "--minutes", f"{minutes:g}"]
    command += ["--out", str(out_dir), "--fresh", "--set", "train.eval.every=0"]
    if threads:
        command += ["--threads", str(threads)]
    command += extra
    log = work / "lmforge.log"
    env = {**os.environ, "LMFORGE_PROGRESS": "0"}
    start = time.perf_counter()
    with log.open("w") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env, check=False)
    wall = time.perf_counter() - start
    if done.returncode:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"lmforge train failed ({done.returncode}):\n{tail}")
    checkpoint = list_checkpoints(out_dir / "checkpoints")[-1]
    config = json.loads((checkpoint / "config.json").read_text())
    train = config["run"]["train"]
    steps = int(checkpoint.name.split("_")[-1])
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    model, _ = load_checkpoint(checkpoint, "cpu")
    m = config["model"]
    result = {
        "steps": steps,
        "planned_steps": state.get("total_steps"),
        "wall_s": round(wall, 2),
        "clock_s": round(float(state.get("seconds", float("nan"))), 2),
        "params": params_of(model),
        "tokens": steps * train["batch_size"] * train["seq_len"] * train["grad_accum_steps"],
        "config": {
            "n_layers": m["n_layers"],
            "d_model": m["d_model"],
            "n_heads": m["n_heads"],
            "seq_len": train["seq_len"],
            "batch_size": train["batch_size"],
            "grad_accum_steps": train["grad_accum_steps"],
            "optimizer": train.get("optimizer"),
            "schedule": train.get("schedule"),
            "lr": train["lr"],
            "precision": train["precision"],
            "command": " ".join(command[1:]),
        },
        "eval": bits_per_byte(model, data["val"], data["byte_lengths"], train["seq_len"]),
    }
    print("  " + " ".join(log.read_text().splitlines()[-1:]), flush=True)
    return result


def load_data() -> dict:
    cfg = small()
    prepared = prepare_corpus(cfg.data, cfg.tokenizer, cache_root(cfg))
    tokenizer = Tokenizer.load(prepared.shard_dir / "tokenizer")
    return {
        "train": load_tokens(prepared.shard_dir, "train"),
        "val": load_tokens(prepared.shard_dir, "val"),
        "vocab": read_meta(prepared.shard_dir).vocab_size,
        "byte_lengths": token_byte_lengths(tokenizer),
        "shard_dir": str(prepared.shard_dir),
    }


def summarize(runs: list[dict]) -> tuple[dict, dict]:
    by = {name: [r for r in runs if r["recipe"] == name] for name in ORDER}
    bpb = {name: [r["eval"]["bpb"] for r in rs] for name, rs in by.items()}
    mean = {name: statistics.mean(v) for name, v in bpb.items() if v}
    summary = {
        name: {
            "bpb": [round(b, 4) for b in bpb[name]],
            "bpb_mean": round(mean[name], 4),
            "params": [r["params"] for r in rs],
            "tokens": [r["tokens"] for r in rs],
            "steps": [r["steps"] for r in rs],
            "wall_s": [r["wall_s"] for r in rs],
            "clock_s": [
                r.get("clock_s", r["wall_s"]) for r in rs
            ],  # a reference's wall is its clock
        }
        for name, rs in by.items()
        if rs
    }
    base = bpb["nanoGPT"]
    for name in ("nanochat", "lmforge"):
        # a half run is missing where the full run did not reach nanoGPT's bpb: nor did it
        half = {r["rep"]: r["eval"]["bpb"] for r in by[f"{name}_half"]}
        summary[name]["half_bpb"] = [round(b, 4) for b in half.values()]
        summary[name]["half_reaches_nanogpt"] = [
            rep in half and half[rep] <= a for rep, a in enumerate(base, start=1)
        ]
        summary[name]["full_reaches_nanogpt"] = [
            b <= a for b, a in zip(bpb[name], base, strict=True)
        ]
    half_wall = statistics.mean(summary["lmforge_half"]["wall_s"])
    half_clock = [
        c / a
        for c, a in zip(
            summary["lmforge_half"]["clock_s"], summary["nanoGPT"]["clock_s"], strict=True
        )
    ]
    targets = {
        "lmforge_lowest_bpb": mean["lmforge"] < min(mean["nanoGPT"], mean["nanochat"]),
        "lmforge_lowest_bpb_per_rep": [
            c < min(a, b) for a, b, c in zip(base, bpb["nanochat"], bpb["lmforge"], strict=True)
        ],
        "lmforge_vs_nanogpt_bpb": round(mean["lmforge"] / mean["nanoGPT"], 4),
        "lmforge_vs_nanochat_bpb": round(mean["lmforge"] / mean["nanochat"], 4),
        "lmforge_half_reaches_nanogpt": mean["lmforge_half"] <= mean["nanoGPT"],
        "lmforge_half_reaches_nanogpt_per_rep": summary["lmforge"]["half_reaches_nanogpt"],
        "lmforge_half_vs_nanogpt_bpb": round(mean["lmforge_half"] / mean["nanoGPT"], 4),
        "lmforge_half_wall_vs_nanogpt_wall": round(
            half_wall / statistics.mean(summary["nanoGPT"]["wall_s"]), 3
        ),
        "lmforge_half_clock_vs_nanogpt_clock_per_rep": [round(r, 3) for r in half_clock],
        "lmforge_half_clock_within_half": max(half_clock) <= 0.5,
        "nanochat_half_reaches_nanogpt": all(summary["nanochat"]["half_reaches_nanogpt"]),
    }
    return summary, targets


def print_table(summary: dict, targets: dict, minutes: float) -> None:
    def cell(values, fmt="{:,}"):
        return " / ".join(fmt.format(v) for v in values)

    print()
    print(
        f"| recipe | params | tokens trained | steps | bpb at {minutes:g} min (per rep) | mean "
        f"| bpb at {minutes / 2:g} min (per rep) | mean |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in ("nanoGPT", "nanochat", "lmforge"):
        s = summary[name]
        half = summary.get(f"{name}_half")
        half_cells = f"{cell(half['bpb'], '{:.4f}')} | {half['bpb_mean']:.4f}" if half else "— | —"
        print(
            f"| {name} | {cell(s['params'])} | {cell(s['tokens'])} | {cell(s['steps'])} | "
            f"{cell(s['bpb'], '{:.4f}')} | {s['bpb_mean']:.4f} | {half_cells} |"
        )
    print()
    met = targets["lmforge_lowest_bpb"]
    print(
        f"target 1, lmforge's bpb the lowest of the three: {'met' if met else 'NOT met'} "
        f"(lmforge/nanoGPT {targets['lmforge_vs_nanogpt_bpb']:.3f}, "
        f"lmforge/nanochat {targets['lmforge_vs_nanochat_bpb']:.3f})"
    )
    met = targets["lmforge_half_reaches_nanogpt"] and targets["lmforge_half_clock_within_half"]
    clocks = " / ".join(f"{r:.3f}" for r in targets["lmforge_half_clock_vs_nanogpt_clock_per_rep"])
    print(
        f"target 2, lmforge reaches nanoGPT's {minutes:g}-minute bpb in <= 0.5x its time: "
        f"{'met' if met else 'NOT met'} (lmforge at {minutes / 2:g} min / nanoGPT at "
        f"{minutes:g} min: {targets['lmforge_half_vs_nanogpt_bpb']:.3f} in bpb; {clocks} in "
        f"time on their clocks, {targets['lmforge_half_wall_vs_nanogpt_wall']:.3f} in wall time "
        "with lmforge's process start-up, teardown and closing validation)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="wall-clock budget per run")
    parser.add_argument("--reps", type=int, default=2, help="interleaved repetitions")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON written")
    parser.add_argument(
        "--threads", type=int, help="CPU threads for all three (default: each its own)"
    )
    parser.add_argument(
        "--lmforge-args",
        default="",
        metavar="ARGS",
        help="more arguments for lmforge train, e.g. '--preset small' (default: none)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    seconds = args.minutes * 60
    data = load_data()
    dtype = reference_dtype()
    print(
        f"train {len(data['train']):,} tokens, val {len(data['val']):,}; references in "
        f"{'bf16' if dtype else 'fp32'}, {torch.get_num_threads()} threads",
        flush=True,
    )
    runs = []
    for rep in range(args.reps):
        for name in ORDER:
            half = name.endswith("_half")
            budget = seconds / 2 if half else seconds
            print(f"rep {rep + 1}/{args.reps}: {name} for {budget / 60:g} min", flush=True)
            if name == "nanoGPT":
                result = run_reference(nanogpt, budget, data, rep, dtype)
            elif name == "nanochat_half" and not _beat(runs, "nanochat", "nanoGPT", rep + 1):
                print("  skipped: nanochat did not reach nanoGPT's bpb in the full budget")
                continue
            elif name.startswith("nanochat"):
                result = run_reference(nanochat, budget, data, rep, dtype, depth=NANOCHAT_DEPTH)
            else:
                with tempfile.TemporaryDirectory(prefix="bench_recipe_") as work:
                    result = run_lmforge(
                        budget / 60, Path(work), data, args.threads, shlex.split(args.lmforge_args)
                    )
            result.update(recipe=name, rep=rep + 1, budget_s=budget)
            runs.append(result)
            print(
                f"  {name}: {result['steps']} steps, {result['tokens']:,} tokens, "
                f"{result['wall_s']} s, bpb {result['eval']['bpb']:.4f}",
                flush=True,
            )

    summary, targets = summarize(runs)
    print_table(summary, targets, args.minutes)
    cpu = read_cpuinfo()
    write_json(
        args.out,
        {
            "minutes": args.minutes,
            "repetitions": args.reps,
            "order": list(ORDER),
            "cpu": cpu.model or platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "threads": args.threads or torch.get_num_threads(),
            "torch": torch.__version__,
            "reference_precision": "bf16" if dtype else "fp32",
            "data": {
                "shard_dir": data["shard_dir"],
                "train_tokens": len(data["train"]),
                "val_tokens": len(data["val"]),
                "vocab": data["vocab"],
            },
            "nanochat_depth": NANOCHAT_DEPTH,
            "runs": runs,
            "summary": summary,
            "targets": targets,
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
