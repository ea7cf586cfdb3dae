"""A run's output folder bookkeeping: claiming it, and writing `stats.json` and `summary.md`.

`stats.json` holds every step's merged statistics (documents and bytes in and out, removals by
reason with examples, counters such as PII per type or duplicate clusters, docs/s and MB/s) in
pipeline order, after the `read` step's. `summary.md` says the same in a page. `stats.json` is
written last: it marks the run finished, so a run killed before it is resumed, and its
temporary files, which a killed process cannot remove, are removed then.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from lmforge.atomic import write_text
from lmforge.data.pipeline.config import PipelineConfig
from lmforge.data.pipeline.passes import Layout, write_json
from lmforge.data.stats import StepStats
from lmforge.errors import LmforgeError

RESULT_KEYS = ("input", "steps", "read", "write", "step_config")  # what changes the output


def load_finished(layout: Layout, cfg: PipelineConfig) -> dict | None:
    """The stats of a finished run of the same config, or None; claims a new folder."""
    config_path = layout.out / "pipeline.json"
    wanted = {k: v for k, v in cfg.to_dict().items() if k in RESULT_KEYS}
    stray = layout.temp_files()  # left half written by a killed run, which could not remove them
    if config_path.exists():
        if json.loads(config_path.read_text()) != wanted:
            raise LmforgeError(
                f"{layout.out} holds a pipeline run with another config: "
                "choose a new --output folder or delete that one"
            )
        _remove(stray)
        stats = layout.out / "stats.json"
        if not stats.exists():
            return None
        shutil.rmtree(layout.work, ignore_errors=True)  # killed while it removed its work files
        return json.loads(stats.read_text())
    if layout.out.exists() and any(p not in stray for p in layout.out.iterdir()):
        raise LmforgeError(f"output folder {layout.out} is not empty: choose a new or empty one")
    _remove(stray)  # a run killed while it claimed the folder
    write_json(config_path, wanted)
    return None


def _remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def merge_results(cfg: PipelineConfig, results: list[dict]) -> list[StepStats]:
    """Every step's stats over all passes and shards, `read` first, then pipeline order."""
    merged = {name: StepStats(name) for name in ["read", *cfg.steps]}
    for result in sorted(results, key=lambda r: (r["pass"], r["shard"])):
        for obj in result["stats"]:
            merged[obj["name"]].merge(StepStats.from_dict(obj))
    return list(merged.values())


def finish_run(layout: Layout, cfg: PipelineConfig, results: list[dict], shards: int) -> dict:
    steps = merge_results(cfg, results)
    last = steps[-1]
    stats = {
        "input": cfg.input,
        "output": cfg.output,
        "format": cfg.write.format,
        "shards": shards,
        "documents_in": steps[0].docs_in,
        "bytes_in": steps[0].bytes_in,
        "documents_out": last.docs_out,
        "bytes_out": last.bytes_out,
        "seconds": round(sum(s.seconds for s in steps), 3),
        "steps": [s.to_dict() for s in steps],
    }
    write_text(layout.out / "summary.md", render_summary(stats))
    write_json(layout.out / "stats.json", stats)  # last: it marks the run finished
    return stats


def render_summary(stats: dict) -> str:
    mb = 1e6
    lines = [
        f"# Data pipeline: {stats['output']}",
        "",
        f"Input: {', '.join(stats['input'])} ({stats['shards']} shards). "
        f"{stats['documents_in']:,} documents ({stats['bytes_in'] / mb:.1f} MB) in, "
        f"{stats['documents_out']:,} ({stats['bytes_out'] / mb:.1f} MB) out as "
        f"{stats['format']}.",
        "",
        "| step | docs in | docs out | removed | MB in | MB out | docs/s | MB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in stats["steps"]:
        removed = sum(s["removed"].values())
        lines.append(
            f"| {s['name']} | {s['docs_in']:,} | {s['docs_out']:,} | {removed:,} | "
            f"{s['bytes_in'] / mb:.1f} | {s['bytes_out'] / mb:.1f} | "
            f"{s['docs_per_s'] or '-'} | {s['mb_per_s'] or '-'} |"
        )
    lines += ["", "## Removed, by reason", ""]
    for s in stats["steps"]:
        for reason, count in sorted(s["removed"].items(), key=lambda kv: -kv[1]):
            examples = s["examples"].get(reason, [])
            ids = ", ".join(f"`{e['id']}`" for e in examples)
            lines.append(f"- {s['name']} / {reason}: {count:,} (e.g. {ids})")
            if examples and examples[0]["text"].strip():
                head = " ".join(examples[0]["text"].split())[:100].replace("`", "'")
                lines.append(f"  - `{head}`")
    counters = [s for s in stats["steps"] if s["counters"]]
    if counters:
        lines += ["", "## Counters", ""]
        for s in counters:
            items = ", ".join(f"{k} {v:,}" for k, v in sorted(s["counters"].items()))
            lines.append(f"- {s['name']}: {items}")
    return "\n".join(lines) + "\n"
