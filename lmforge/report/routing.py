"""The report's mixture-of-experts section: how the last logged step routed its tokens.

A histogram of the rows each expert took (summed over the MoE blocks), as shares of an even
split, beside the dropped-row fraction, the balance losses and the balance bias drift that
metrics.jsonl records (model/moe.py's `moe_metrics`). A dense run has none of these: no section.
"""

from __future__ import annotations

BAR = 30  # characters of the histogram's longest bar


def routing_section(metrics: list[dict]) -> list[str]:
    """Markdown lines for the last record with routing counts, or [] for a dense run."""
    record = next((r for r in reversed(metrics) if r.get("moe/counts")), None)
    if record is None:
        return []
    counts = record["moe/counts"]
    total, most = sum(counts), max(counts)
    even = total / len(counts)
    lines = [
        "### Expert routing",
        "",
        f"Rows each expert took at step {record['step']} (all MoE blocks; an even split is "
        f"{even:,.0f} each): dropped {record.get('moe/dropped', 0.0):.1%}, aux loss "
        f"{record.get('moe/aux_loss', 0.0):.4f}, z loss {record.get('moe/z_loss', 0.0):.4f}, "
        f"largest balance bias {record.get('moe/bias_drift', 0.0):.4f}.",
        "",
        "```",
    ]
    for expert, count in enumerate(counts):
        bar = "#" * round(BAR * count / most) if most else ""
        lines.append(f"expert {expert:>3} {count:>9,} {count / even:5.2f}x {bar}")
    return [*lines, "```", ""]
