"""An RL run's report: `RUN/report.md` and `RUN/rl.png`, from its metrics.jsonl, rl.json and
rl_config.json (posttrain/grpo.py writes them)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from lmforge.posttrain.rollout import paired_gain
from lmforge.train.metrics import read_metrics

PANELS = (
    ("reward", ("reward_mean", "accuracy"), "per step, over the rollouts"),
    ("response length", ("response_length",), "completion tokens"),
    ("entropy", ("entropy",), "nats per completion token"),
    ("clipped / KL", ("clip_fraction", "kl"), "fraction of tokens; k3 KL"),
    ("throughput", ("rollout_tokens_per_s", "train_tokens_per_s"), "tokens/s"),
)


def plot_rl(metrics: list[dict], path: str | Path) -> Path:
    """Per-step training curves and the held-out accuracy with its standard error."""
    path = Path(path)
    fig, axes = plt.subplots(2, 3, figsize=(14, 7), dpi=110)
    for ax, (title, keys, unit) in zip(axes.flat, PANELS, strict=False):
        for key in keys:
            points = [(m["step"], m[key]) for m in metrics if key in m]
            if points:
                ax.plot(*zip(*points, strict=True), label=key, linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    held = [m for m in metrics if "test_accuracy" in m]
    ax = axes.flat[-1]
    if held:
        steps = [m["step"] for m in held]
        errors = [2 * m["test_stderr"] for m in held]
        accuracy = [m["test_accuracy"] for m in held]
        ax.errorbar(steps, accuracy, yerr=errors, fmt="o-", capsize=3, label="pass@1 (sampled)")
        greedy = [m.get("test_greedy_accuracy") for m in held]
        if None not in greedy:
            ax.plot(steps, greedy, "s--", label="greedy")
        ax.legend(fontsize=8)
    ax.set_title("held-out accuracy (± 2 SE)")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _mean(metrics: list[dict], key: str) -> float | None:
    values = [m[key] for m in metrics if key in m]
    return sum(values) / len(values) if values else None


def write_rl_report(run_dir: str | Path) -> Path:
    run = Path(run_dir)
    metrics = read_metrics(run / "metrics.jsonl")
    summary = json.loads((run / "rl.json").read_text())
    settings = json.loads((run / "rl_config.json").read_text())
    plot = plot_rl(metrics, run / "rl.png")
    start, final = summary["start_accuracy"], summary["final_accuracy"]
    gain, gain_se = paired_gain(start, final)
    lines = [
        f"# RL run: GRPO on {summary['task']}",
        "",
        f"Started from `{settings['base']}`; {summary['steps']} steps in "
        f"{summary['seconds'] / 60:.1f} min (seed {summary['seed']}).",
        "",
        f"## Held-out accuracy ({final['total']} test problems, seed {summary['eval_seed']})",
        "",
        f"pass@1: the mean over {final['samples']} completions per problem sampled as the "
        "rollouts are; greedy: the greedy reply. Standard errors are over problems.",
        "",
        "| | pass@1 (sampled) | greedy |",
        "|---|---|---|",
        *(
            f"| {name} | {r['accuracy']:.3f} ± {r['stderr']:.3f} | "
            f"{r['greedy_accuracy']:.3f} ± {r['greedy_stderr']:.3f} |"
            for name, r in (("start", start), ("end", final))
        ),
        "",
        f"pass@1 gain {gain:+.3f} ± {gain_se:.3f} ({gain / gain_se if gain_se else 0:.1f} standard "
        "errors of the paired difference).",
        "",
        "## Training",
        "",
        f"![curves]({plot.name})",
        "",
        "| setting | value |",
        "|---|---|",
    ]
    for key in ("group_size", "prompts_per_step", "lr", "num_iterations", "temperature",
                "scale_rewards", "loss_norm", "beta", "dynamic_sampling", "lora"):  # fmt: skip
        lines.append(f"| {key} | {settings.get(key)} |")
    rollout, trained = _mean(metrics, "rollout_tokens_per_s"), _mean(metrics, "train_tokens_per_s")
    if rollout and trained:
        lines += [
            "",
            f"Rollouts generated {rollout:,.0f} completion tokens/s; training processed "
            f"{trained:,.0f} tokens/s (prompt + completion).",
        ]
    path = run / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
