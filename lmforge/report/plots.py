"""Loss-curve plots (matplotlib, headless; imported when a plot is drawn, not at start-up)."""

from __future__ import annotations

from pathlib import Path


def plot_loss(metrics: list[dict], path: str | Path, title: str = "loss") -> Path:
    """Training loss per step, with validation loss where it was measured, and beside them the
    task scores of `train.eval.tasks` (metrics named `task_<name>`) where there are any."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    train = [(m["step"], m["loss"]) for m in metrics if "loss" in m]
    val = [(m["step"], m["val_loss"]) for m in metrics if "val_loss" in m]
    tasks = sorted({k for m in metrics for k in m if k.startswith("task_")})
    fig, axes = plt.subplots(1, 2 if tasks else 1, figsize=(12 if tasks else 7, 4), dpi=120)
    ax = axes[0] if tasks else axes
    if train:
        ax.plot(*zip(*train, strict=False), label="train loss", linewidth=1.2)
    if val:
        ax.plot(*zip(*val, strict=False), "o-", label="validation loss", markersize=4)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    if tasks:
        scores = axes[1]
        for name in tasks:
            points = [(m["step"], m[name]) for m in metrics if name in m]
            scores.plot(*zip(*points, strict=True), "o-", label=name[5:], markersize=4)
        scores.set_xlabel("step")
        scores.set_ylabel("score (accuracy)")
        scores.set_title("tasks (train.eval.tasks)")
        scores.grid(alpha=0.3)
        scores.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
