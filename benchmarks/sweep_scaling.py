"""The scaling sweep behind the self-sizing recipe: every shape of the ladder trained for
wall-clock budgets of 1 to 8 minutes on this machine (the shape the speedrun picks here, to 32),
then the rule bpb(N, D) fitted on them.

    python benchmarks/sweep_scaling.py                 # the sweep, then the fit and the plot
    python benchmarks/sweep_scaling.py --fit-only      # refit and replot the saved points

Each shape's step time is measured first on a quiet machine; a budget of M minutes is then the
step count M minutes hold at that speed, so the points are in tokens and stay right if the
machine gets busy later; a shape already in the record keeps the step time its points were
swept with, so longer budgets extend the same step counts. One run per shape trains to its
longest budget with the recipe's WSD schedule; each shorter budget branches from the checkpoint
where its own decay would start (on the plateau the runs are identical, warmup included) and
decays from there, so a shape costs its longest budget plus a fifth of the others. Writes
benchmarks/results/scaling_sweep.json (the points), lmforge/recipe/scaling_rule.json (the
rule) and benchmarks/results/scaling.png (the plot).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import lmforge.train.loop as loop  # noqa: E402
from lmforge.atomic import write_json  # noqa: E402
from lmforge.config import small  # noqa: E402
from lmforge.prepare import prepare_corpus  # noqa: E402
from lmforge.recipe.scaling import RULE_FILE, fit  # noqa: E402
from lmforge.recipe.shapes import LADDER, shape  # noqa: E402
from lmforge.recipe.timing import seconds_per_step  # noqa: E402
from lmforge.speedrun import cache_root  # noqa: E402
from lmforge.tokens import read_meta  # noqa: E402
from lmforge.train import train  # noqa: E402
from lmforge.train.checkpoint import save_checkpoint  # noqa: E402
from lmforge.train.config import CheckpointConfig, EvalConfig, ScheduleConfig  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "scaling_sweep.json"
PLOT = ROOT / "benchmarks" / "results" / "scaling.png"
DECAY_FRAC = 0.2  # so a budget of 5m steps decays from step 4m


def recipe_train_config(optimizer: str):
    cfg = small().train
    return dataclasses.replace(
        cfg, log_every=50, minutes=0.0, device="cpu",
        optimizer=dataclasses.replace(cfg.optimizer, name=optimizer),
        schedule=ScheduleConfig(kind="wsd", decay_frac=DECAY_FRAC, min_lr_ratio=0.0,
                                warmup_frac=1.0, warmup_steps=cfg.schedule.warmup_steps),
        eval=EvalConfig(every=0, batches=64), checkpoint=CheckpointConfig(every=0),
    )  # fmt: skip


def shape_config(name, vocab):
    return shape(name).model_config(dataclasses.replace(small().model, vocab_size=vocab))


def sweep_shape(name, budgets, optimizer, per_step, shard_dir, vocab, work, record):
    model_config = shape_config(name, vocab)
    cfg = recipe_train_config(optimizer)
    unit = max(1, round(budgets[0] * 60 / per_step / 5))  # the shortest budget: 5 · unit steps
    totals = [5 * unit * round(b / budgets[0]) for b in budgets]
    warmup = max(1, math.ceil(0.05 * totals[0]))  # the shortest run's 5 %, for every branch
    cfg = dataclasses.replace(
        cfg,
        schedule=dataclasses.replace(cfg.schedule, warmup_steps=warmup),
        checkpoint=CheckpointConfig(every=4 * unit),
    )
    print(f"{name}: {per_step * 1000:.0f} ms/step; budgets {budgets} min = {totals} steps")
    main = work / f"{name}-{optimizer}"
    results = []
    t0 = time.perf_counter()
    main_result = train(model_config, dataclasses.replace(cfg, max_steps=totals[-1]), shard_dir,
                        main, resume=False, threads=torch.get_num_threads())  # fmt: skip
    wall = {totals[-1]: time.perf_counter() - t0}
    outcomes = {totals[-1]: main_result}
    for total in totals[:-1]:
        branch = work / f"{name}-{optimizer}-{total}"
        start = total - round(DECAY_FRAC * total)
        checkpoint = Path("checkpoints") / f"step_{start}"
        shutil.copytree(main / checkpoint, branch / checkpoint)
        t0 = time.perf_counter()
        outcomes[total] = train(model_config, dataclasses.replace(cfg, max_steps=total),
                                shard_dir, branch, threads=torch.get_num_threads())  # fmt: skip
        wall[total] = time.perf_counter() - t0
        shutil.rmtree(branch)
    shutil.rmtree(main)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    for budget, total in zip(budgets, totals, strict=True):
        ev = outcomes[total].final_eval
        results.append({
            "shape": name, "optimizer": optimizer, "params": shape(name).params(vocab),
            "budget_minutes": budget, "steps": total, "tokens": total * tokens_per_step,
            "seconds_per_step": round(per_step, 5), "val_loss": round(ev.loss, 5),
            "val_bpb": round(ev.bpb, 5), "eval_tokens": ev.tokens,
            "wall_s": round(wall[total], 1),
        })  # fmt: skip
        print(f"  {budget:g} min, {total} steps: {ev.bpb:.4f} bpb")
    for r in results:
        record(r)


def load_results() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"points": []}


def save_results(results: dict) -> None:
    write_json(RESULTS, results, indent=1)


def minutes(point: dict, timing: dict) -> float:
    """The wall-clock minutes a point's steps take here at the quiet re-timed speed (else the
    speed its sweep measured before training)."""
    return point["steps"] * timing.get(point["shape"], point["seconds_per_step"]) / 60


def fit_and_plot(results: dict) -> None:
    points, timing = results["points"], results.get("timing", {})
    used = [p for p in points if p["optimizer"] == "muon"]
    rule = fit([p["params"] for p in used], [p["tokens"] for p in used],
               [p["val_bpb"] for p in used], [p["shape"] for p in used])  # fmt: skip
    rule.save(RULE_FILE)
    print(f"rule: bpb = {rule.E:.3f} + {rule.A:.4g}/N^{rule.alpha} + {rule.B:.4g}/D^{rule.beta}"
          f" (rms {rule.rms_error:.4f} over {rule.points} points) -> {RULE_FILE}")  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_d, ax_n) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = sorted({p["shape"] for p in used}, key=lambda s: shape(s).params(4096))
    for i, name in enumerate(names):
        pts = sorted((p for p in used if p["shape"] == name), key=lambda p: p["tokens"])
        color = plt.cm.viridis(i / max(1, len(names) - 1))
        n = pts[0]["params"]
        ax_d.plot([p["tokens"] for p in pts], [p["val_bpb"] for p in pts], "o", color=color,
                  label=f"{name} ({n / 1e6:.1f}M)")  # fmt: skip
        d = np.geomspace(min(p["tokens"] for p in used) / 2, max(p["tokens"] for p in used) * 2)
        ax_d.plot(d, [rule.bpb(n, x) for x in d], "-", color=color, alpha=0.6)
        ax_n.plot([minutes(p, timing) for p in pts], [p["val_bpb"] for p in pts], "o-",
                  color=color, label=name)  # fmt: skip
    for p in points:
        if p["optimizer"] != "muon":
            ax_n.plot(minutes(p, timing), p["val_bpb"], "x", color="red")
    ax_d.set(xscale="log", xlabel="tokens trained (D)", ylabel="validation bits per byte",
             title="sweep points and the fitted rule")  # fmt: skip
    ax_n.set(xscale="log", xlabel="training minutes on this machine", ylabel="bits per byte",
             title="by wall-clock budget (x: AdamW)")  # fmt: skip
    ax_d.legend(fontsize=7)
    ax_n.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    print(f"plot: {PLOT}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(s.name for s in LADDER))
    p.add_argument("--budgets", default="1,2,4,8", help="minutes, each double the one before")
    p.add_argument("--optimizer", default="muon")
    p.add_argument("--fit-only", action="store_true")
    p.add_argument(
        "--retime", action="store_true", help="time the swept shapes again (quietly), then refit"
    )
    args = p.parse_args()
    results = load_results()
    points = results["points"]
    if args.retime:
        cfg = small()
        prepared = prepare_corpus(cfg.data, cfg.tokenizer, cache_root(cfg))
        vocab = read_meta(prepared.shard_dir).vocab_size
        train_cfg = recipe_train_config("muon")
        results["timing"] = {
            name: seconds_per_step(shape_config(name, vocab), train_cfg, prepared.shard_dir, 5)
            for name in sorted({p["shape"] for p in points})
        }
        print(f"seconds per step: {results['timing']}")
        save_results(results)
    elif not args.fit_only:
        cfg = small()
        prepared = prepare_corpus(cfg.data, cfg.tokenizer, cache_root(cfg))
        vocab = read_meta(prepared.shard_dir).vocab_size
        budgets = [float(b) for b in args.budgets.split(",")]
        cpuinfo = Path("/proc/cpuinfo").read_text()
        machine = cpuinfo.split("model name")[1].split("\n")[0].strip("\t: ")
        work = Path(tempfile.mkdtemp(prefix="sweep-"))
        real_save = loop.save_checkpoint
        loop.save_checkpoint = functools.partial(save_checkpoint, keep_last=10**6)
        names = args.shapes.split(",")
        cfg = recipe_train_config(args.optimizer)
        swept = {
            q["shape"]: q["seconds_per_step"] for q in points if q["optimizer"] == args.optimizer
        }
        speeds = {  # all timed first, while the machine is as quiet as it will be
            name: swept.get(name)
            or seconds_per_step(shape_config(name, vocab), cfg, prepared.shard_dir, steps=4)
            for name in names
        }
        try:
            for name in names:

                def record(r):
                    points[:] = [q for q in points if (q["shape"], q["optimizer"], q["steps"])
                                 != (r["shape"], r["optimizer"], r["steps"])] + [r]  # fmt: skip
                    results["machine"] = f"{machine}, {torch.get_num_threads()} threads"
                    save_results(results)

                sweep_shape(name, budgets, args.optimizer, speeds[name], prepared.shard_dir, vocab,
                            work, record)  # fmt: skip
        finally:
            loop.save_checkpoint = real_save
            shutil.rmtree(work, ignore_errors=True)
    fit_and_plot(results)


if __name__ == "__main__":
    main()
