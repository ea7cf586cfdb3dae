"""`report.md`: what a run did and how well, in one page.

The report is assembled from what the run wrote to disk (config, data statistics, metrics,
evaluation, samples), so it can be regenerated at any time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.report.plan_table import plan_vs_measured
from lmforge.report.plots import plot_loss
from lmforge.train.metrics import read_metrics


@dataclass
class Sample:
    prompt: str
    completion: str


@dataclass
class ReportData:
    name: str
    config_toml: str
    data_stats: dict
    tokenizer: dict  # vocab_size, bytes_per_token
    model: dict  # parameters, ...
    training: dict  # steps, seconds, tokens, tokens_per_s, precision, mfu, peak_memory_bytes
    evaluation: dict  # val_loss, val_bpb, unigram_bpb
    samples: list[Sample] = field(default_factory=list)


def write_report(run_dir: str | Path, data: ReportData) -> Path:
    run_dir = Path(run_dir)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    plot = plot_loss(metrics, run_dir / "plots" / "loss.png", title=f"{data.name}: loss")
    plan = plan_vs_measured(data.config_toml, data.training, metrics)
    text = render(data, plot.relative_to(run_dir).as_posix(), plan)
    path = run_dir / "report.md"
    tmp = path.with_name("report.md.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def _cleaning(stats: dict) -> list[str]:
    """Rows for what the data pipeline removed or masked, when it ran."""
    rows = []
    if "near_duplicates_removed" in stats:
        rows.append(f"| near duplicates removed (MinHash) | {stats['near_duplicates_removed']} |")
    for name, key in (("quality rules removed", "quality_removed"), ("PII masked", "pii_masked")):
        counts = stats.get(key) or {}
        if counts:
            detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            rows.append(f"| {name} | {sum(counts.values())} ({detail}) |")
    return rows


def _throughput(tr: dict) -> list[str]:
    if "precision" not in tr:
        return []
    return [
        "| precision | tokens/s | MFU | peak memory | skipped steps |",
        "|---|---|---|---|---|",
        f"| {tr['precision']} | {tr['tokens_per_s']:.0f} | {tr['mfu']:.1%} | "
        f"{tr['peak_memory_bytes'] / 2**20:.1f} MB | {tr.get('skipped_steps', 0)} |",
        "",
        "MFU: the model's analytic training FLOPs per token (6 per weight plus attention) times "
        "tokens/s, over the peak matmul FLOP/s of the precision used (measured on a CPU, "
        "datasheet on a GPU). Peak memory: the CUDA allocator's peak on a GPU; elsewhere "
        "weights, gradients, optimizer state and the activations saved for backward (measured).",
        "",
    ]


def render(data: ReportData, plot_path: str, plan: list[str] = ()) -> str:
    """The report's Markdown; `plan` holds the plan-vs-measured rows (plan_table.py)."""
    stats, tok, ev, tr = data.data_stats, data.tokenizer, data.evaluation, data.training
    lines = [
        f"# lmforge run: {data.name}",
        "",
        "## Result",
        "",
        "| metric | value |",
        "|---|---|",
        f"| validation loss (nats/token) | {ev['val_loss']:.4f} |",
        f"| validation bits per byte | **{ev['val_bpb']:.4f}** |",
        f"| unigram baseline bits per byte | {ev['unigram_bpb']:.4f} |",
        f"| improvement over unigram | {ev['unigram_bpb'] / ev['val_bpb']:.2f}× fewer bits |",
        "",
        "## Data",
        "",
        "| | |",
        "|---|---|",
        f"| source | {stats['source']} |",
        f"| files read | {stats['files']} (skipped, not UTF-8: {stats['skipped_not_utf8']}) |",
        f"| documents in | {stats['documents_in']} ({stats['bytes_in'] / 1e6:.1f} MB) |",
        f"| exact duplicates removed | {stats['duplicates_removed']} |",
        *_cleaning(stats),
        f"| documents train / val | {stats['documents']['train']} / {stats['documents']['val']} |",
        f"| tokens train / val | {stats['tokens']['train']:,} / {stats['tokens']['val']:,} |",
        "",
        "## Tokenizer",
        "",
        f"Byte-level BPE, vocabulary {tok['vocab_size']}, "
        f"{tok['bytes_per_token']:.2f} bytes per token on the validation split.",
        "",
        "## Training",
        "",
        f"Model: {data.model['parameters'] / 1e6:.2f}M parameters ({data.model['shape']}).",
        "",
        f"{tr['steps']} steps in {tr['seconds']:.0f} s, "
        f"{tr['tokens']:,} tokens at {tr['tokens_per_s']:.0f} tokens/s.",
        "",
        *_throughput(tr),
        *plan,
        f"![loss curve]({plot_path})",
        "",
        "## Samples",
        "",
    ]
    for sample in data.samples:
        lines += [
            f"Prompt: `{sample.prompt!r}`",
            "",
            "```",
            sample.prompt + sample.completion,
            "```",
            "",
        ]
    lines += ["## Config", "", "```toml", data.config_toml.rstrip(), "```", ""]
    return "\n".join(lines)
