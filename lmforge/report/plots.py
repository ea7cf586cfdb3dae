"""Loss-curve plots (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_loss(metrics: list[dict], path: str | Path, title: str = "loss") -> Path:
    """Training loss per step, with validation loss where it was measured."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    train = [(m["step"], m["loss"]) for m in metrics if "loss" in m]
    val = [(m["step"], m["val_loss"]) for m in metrics if "val_loss" in m]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        ax.plot(*zip(*train, strict=False), label="train loss", linewidth=1.2)
    if val:
        ax.plot(*zip(*val, strict=False), "o-", label="validation loss", markersize=4)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
