"""`report.md`: what a run did and how well, in one page.

The report is assembled from what the run wrote to disk (config, data statistics, metrics,
evaluation, samples), so it can be regenerated at any time.

Two evaluations are named apart: the *final evaluation* (up to 64 batches of the validation
split, after training: the report's headline, `final_val_*` in metrics.jsonl) and the
*periodic validation* during training (`train.eval.batches` batches: `val_*` in metrics.jsonl).
A run whose final evaluation does not beat the unigram baseline gets a warning line.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.atomic import write_text
from lmforge.report.plan_table import plan_vs_measured
from lmforge.report.plots import plot_loss
from lmforge.report.routing import routing_section
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
    # val_loss, val_bpb, unigram_bpb of the final evaluation; optionally its batches, windows,
    # seq_len and tokens, and periodic_val_bpb and periodic_batches of the periodic validation
    evaluation: dict
    samples: list[Sample] = field(default_factory=list)
    sizing: dict | None = None  # recipe.sizing.Sizing as a dict, plus its `reason`
    # calibrated_tokens_per_s (timed before training), trained tokens_per_s, and
    # others_cpu_share: the CPU capacity other processes used while it trained (None: unknown)
    machine_load: dict | None = None
    tasks: dict | None = None  # eval/summary.json of the code suite (lmforge.eval.run_tasks.save)


def write_report(run_dir: str | Path, data: ReportData) -> Path:
    run_dir = Path(run_dir)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    plot = plot_loss(metrics, run_dir / "plots" / "loss.png", title=f"{data.name}: loss")
    plan = plan_vs_measured(data.config_toml, data.training, metrics)
    text = render(data, plot.relative_to(run_dir).as_posix(), plan, routing_section(metrics))
    return write_text(run_dir / "report.md", text)


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
        "| precision | tokens/s | MFU | peak memory | skipped steps | CPU threads |",
        "|---|---|---|---|---|---|",
        f"| {tr['precision']} | {tr['tokens_per_s']:.0f} | {tr['mfu']:.1%} | "
        f"{tr['peak_memory_bytes'] / 2**20:.1f} MB | {tr.get('skipped_steps', 0)} | "
        f"{tr.get('threads', '')} |",
        "",
        "MFU: the model's analytic training FLOPs per token (6 per weight plus attention) times "
        "tokens/s, over the peak matmul FLOP/s of the precision used (measured on a CPU, "
        "datasheet on a GPU). Peak memory: the CUDA allocator's peak on a GPU; elsewhere "
        "weights, gradients, optimizer state and the activations saved for backward (measured). "
        "CPU threads: given by --threads or LMFORGE_THREADS, else the fastest of the counts "
        "timed on the first steps.",
        "",
    ]


def baseline_warning(val_bpb: float, unigram_bpb: float) -> str | None:
    """The warning for a model that does not beat the unigram baseline, else None."""
    if val_bpb < unigram_bpb:
        return None
    return (
        f"the model does not beat the unigram baseline ({val_bpb:.4f} vs {unigram_bpb:.4f} bits "
        "per byte): it predicts no better than token frequencies alone; train longer, lower "
        "train.optimizer.lr, or check the data"
    )


def warn_if_behind_baseline(val_bpb: float, unigram_bpb: float) -> None:
    """Print `baseline_warning` on stderr when there is one: the console's copy of the report's."""
    warning = baseline_warning(val_bpb, unigram_bpb)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)


def _result(ev: dict) -> list[str]:
    """The Result section's warning, table and the note that tells the two evaluations apart."""
    warning = baseline_warning(ev["val_bpb"], ev["unigram_bpb"])
    ratio = ev["unigram_bpb"] / ev["val_bpb"]
    improvement = f"{ratio:.2f}× fewer bits" if warning is None else f"none ({ratio:.2f}×)"
    lines = [f"> **Warning: {warning}**", ""] if warning else []
    lines += [
        "| metric | value |",
        "|---|---|",
        f"| final evaluation: validation loss (nats/token) | {ev['val_loss']:.4f} |",
        f"| final evaluation: validation bits per byte | **{ev['val_bpb']:.4f}** |",
        f"| unigram baseline bits per byte | {ev['unigram_bpb']:.4f} |",
        f"| improvement over unigram | {improvement} |",
    ]
    if "periodic_val_bpb" in ev:
        lines.append(
            f"| periodic validation bits per byte, last (`val_bpb` in metrics.jsonl) | "
            f"{ev['periodic_val_bpb']:.4f} |"
        )
    lines.append("")
    if "batches" in ev:
        periodic = ev.get("periodic_batches")
        lines += [
            f"The final evaluation read {ev['batches']} batches ({ev['windows']} windows of "
            f"{ev['seq_len']} tokens, {ev['tokens']:,} text tokens) of the validation split "
            "after training: `final_val_loss` and `final_val_bpb` in metrics.jsonl. "
            + (
                f"The periodic validation during training reads {periodic} batches "
                f"(`train.eval.batches`): `val_loss` and `val_bpb` there, so the two differ."
                if periodic
                else ""
            ),
            "",
        ]
    return lines


BUSY_SHARE = 0.25
"""Other processes using more than this share of the CPUs while a run trained: a busy machine."""


def _sizing(sizing: dict | None) -> list[str]:
    if not sizing:
        return []
    rows = [
        "### Shape, sized to the budget",
        "",
        f"Chosen: {sizing['chosen']}. Why: {sizing['reason']}.",
        "",
        f"Start-up and timing the candidates took {sizing['sizing_s']:.0f} s of the "
        f"{sizing['budget_s'] / 60:g} min budget; training had {sizing['train_minutes']:.2f} min.",
        "",
        "| shape | parameters | predicted tokens/s | measured tokens/s | predicted bpb |",
        "|---|---|---|---|---|",
    ]
    for c in sizing["candidates"]:
        measured = f"{c['measured_tokens_per_s']:,.0f}" if c["measured_tokens_per_s"] else "-"
        bpb = c["bpb_at_measured"] if c["bpb_at_measured"] is not None else c["predicted_bpb"]
        rows.append(
            f"| {c['shape']} | {c['params'] / 1e6:.1f}M | {c['predicted_tokens_per_s']:,.0f} | "
            f"{measured} | {bpb:.3f} |"
        )
    rows += [
        "",
        "Predicted tokens/s: the FLOP rate of the first shape timed, over each shape's FLOPs "
        "per token. Predicted bpb: the scaling rule (README) at the tokens the budget holds, at "
        "the measured speed where timed.",
        "",
    ]
    return rows


def _machine_load(load: dict | None) -> list[str]:
    if not load:
        return []
    calibrated, trained = load.get("calibrated_tokens_per_s"), load["tokens_per_s"]
    share = load.get("others_cpu_share")
    busy = share is not None and share > BUSY_SHARE
    speed = f"Training ran at {trained:,.0f} tokens/s"
    if calibrated:
        speed += f", {trained / calibrated:.0%} of the {calibrated:,.0f} tokens/s timed before it"
    if share is None:
        verdict = "The machine's load is unknown here (no /proc/stat)"
    else:
        verdict = "**The machine was busy**" if busy else "The machine was quiet"
    used = f": other processes used {share:.0%} of its CPUs" if share is not None else ""
    return [
        "### Machine load",
        "",
        f"{verdict} while training{used}. {speed}"
        + ("; the schedule's decay was fitted to the time actually left." if busy else "."),
        "",
    ]


def _tasks(summary: dict | None) -> list[str]:
    """The code suite's scores against chance, contamination, and 3 failures per task."""
    if not summary:
        return []
    lines = [
        "## Tasks: the code suite",
        "",
        "Built from the validation split's documents only, so no example was trained on. "
        "Reproduce with `lmforge eval --checkpoint <run> --tasks code`.",
        "",
        "| task | kind | score | ± | chance | above chance | centered | contamination |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in summary["tasks"]:
        m, head, chance = t["metrics"], t["headline"], t["baseline"]
        err = m.get(f"{head}_stderr")
        lines.append(
            f"| {t['task']} ({t['examples']}) | {t['output_type']} | {head} {m[head]:.3f} | "
            f"{err:.3f} | {chance:.3f} | {m[head] - chance:+.3f} | {t['centered']:.3f} | "
            f"{t.get('contamination', float('nan')):.1%} |"
            if err is not None
            else f"| {t['task']} | {t['output_type']} | {head} {m[head]:.3f} | | | | | |"
        )
    aggregate = summary.get("code_suite_aggregate")
    if aggregate is not None:
        lines += [
            "",
            f"CORE-style aggregate, the mean of (score - chance) / (1 - chance): "
            f"**{aggregate:.3f}** (0 is chance, 1 is perfect). Contamination: the share of "
            "examples that share a 13-word n-gram with a training document.",
        ]
    lines += ["", "Failures, the first 3 per task:", ""]
    for t in summary["tasks"]:
        for r in t.get("failures", []):
            lines.append(f"- {t['task']}: {_failure(r)}")
    return [*lines, ""]


def _failure(record: dict) -> str:
    """One wrong example: the end of its prompt, what the model chose and what was right."""

    def clip(text: object, n: int = 60) -> str:
        text = str(text)
        text = text if len(text) <= n else "…" + text[-n:]
        return "`" + text.replace("`", "'").replace("\n", "⏎") + "`"

    after = f"after {clip(record.get('prompt', ''))}"
    choices, pred = record.get("choices"), record.get("prediction")
    if choices is not None and isinstance(pred, int):
        return f"{after} chose {clip(choices[pred], 40)}, not {clip(choices[record['gold']], 40)}"
    if "generation" in record:
        return f"{after} wrote {clip(record['generation'], 40)}, not {clip(record['gold'], 40)}"
    return f"{after} the gold {clip(record.get('gold_text', ''), 40)} was not the greedy choice"


def render(data: ReportData, plot_path: str, plan: list[str] = (), routing: list[str] = ()) -> str:
    """The report's Markdown; `plan` holds the plan-vs-measured rows (plan_table.py),
    `routing` a mixture of experts' routing (routing.py)."""
    stats, tok, ev, tr = data.data_stats, data.tokenizer, data.evaluation, data.training
    lines = [
        f"# lmforge run: {data.name}",
        "",
        "## Result",
        "",
        *_result(ev),
        *_tasks(data.tasks),
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
        *_sizing(data.sizing),
        *_machine_load(data.machine_load),
        *plan,
        *routing,
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
