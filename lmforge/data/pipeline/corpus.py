"""The speedrun's cleaning: its corpus through the quality rules, PII masking, exact and
near-duplicate removal, summarized under the keys the run report reads.

The quality rules follow `data.quality_profile`: `auto` (the default) judges each document by
the code rules when it is source code (by its file type, else by its text) and by Gopher's prose
rules otherwise, so the standard library gets the code rules and a corpus of stories the prose
ones; `code` or `prose` applies one set to every document; `off` skips the step.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from lmforge.data.documents import DOC_SEPARATOR, Document
from lmforge.data.pipeline.commands import run_pipeline
from lmforge.data.pipeline.config import load_pipeline_config
from lmforge.data.pipeline.writers import read_output

SPEEDRUN_STEPS = ["quality", "pii", "exact_dedup", "minhash_dedup"]


def clean_corpus(
    path: str,
    workers: int,
    work: Path,
    quality_profile: str = "auto",
    doc_separator: str = DOC_SEPARATOR,
) -> tuple[Iterator[Document], dict]:
    """Run the speedrun's steps over `path` (empty: the stdlib) into `work`.

    Returns the cleaned documents (read lazily from `work`) and the report's statistics: the
    keys `files`, `skipped_not_utf8`, `documents_in`, `bytes_in`, `duplicates_removed`, plus
    `near_duplicates_removed`, `quality_removed`, `quality_profiles` (documents judged by each
    profile), `pii_masked` and the full `pipeline` stats.
    """
    if (work / "stats.json").exists() and not any(work.glob("shard_*")):
        shutil.rmtree(work)  # finished before and its shards already copied out: redo
    steps = [s for s in SPEEDRUN_STEPS if s != "quality" or quality_profile != "off"]
    settings = ["write.format=jsonl"]
    if quality_profile != "off":
        settings.append(f"quality.profile={quality_profile}")
    flags = {"input": [path or "stdlib"], "output": str(work), "steps": steps, "workers": workers}
    cfg = load_pipeline_config(None, flags, settings)
    cfg.read = dataclasses.replace(cfg.read, doc_separator=doc_separator)
    stats = run_pipeline(cfg)
    step = {s["name"]: s for s in stats["steps"]}
    read = step["read"]
    reasons = [r for r in ("not_utf8", "binary_file") if r in read["removed"]]
    skipped = sum(read["removed"][r] for r in reasons)
    if skipped:
        example = read["examples"][reasons[0]][0]["id"]
        print(
            f"warning: skipped {skipped} file(s) that are not UTF-8 text, e.g. {example}",
            file=sys.stderr,
        )
    summary = {
        "files": read["counters"].get("files", 0),
        "skipped_not_utf8": skipped,
        "documents_in": read["docs_out"],
        "bytes_in": read["bytes_out"],
        "duplicates_removed": step["exact_dedup"]["removed"].get("duplicate", 0),
        "near_duplicates_removed": step["minhash_dedup"]["removed"].get("near_duplicate", 0),
        "quality_removed": step["quality"]["removed"] if "quality" in step else {},
        "quality_profiles": {
            name.removeprefix("profile_"): n
            for name, n in step.get("quality", {}).get("counters", {}).items()
            if name.startswith("profile_")
        },
        "pii_masked": {k: v for k, v in step["pii"]["counters"].items() if k != "documents_masked"},
        "pipeline": stats,
    }
    return read_output(work), summary


def drop_shards(work: Path) -> None:
    """Remove the cleaned shards once copied out; the pipeline's stats and summary stay."""
    for shard in work.glob("shard_*"):
        shard.unlink()
    shutil.rmtree(work / ".work", ignore_errors=True)
