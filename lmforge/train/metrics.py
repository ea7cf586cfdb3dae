"""`metrics.jsonl`: one JSON object per logged step, the same keys in every command that trains."""

from __future__ import annotations

import json
from pathlib import Path

from lmforge.atomic import disk_full_is_an_error

DISK_FULL_FIX = (
    "free space on that disk, then run the same command again: it resumes from its newest "
    "checkpoint"
)


class MetricsLog:
    """Appends one line per record and flushes it, so a crash loses at most the line in flight
    (a full disk: one line of error). A log that is not `enabled` (on a run's other ranks:
    rank 0 writes) writes nothing."""

    def __init__(self, path: str | Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, **record: float | int | str) -> None:
        if not self.enabled:
            return
        full = disk_full_is_an_error("the metrics log", self.path, DISK_FULL_FIX)
        with full, open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop records past `step` (a resumed run rewrites the steps it repeats) and any line
        a killed process left half written."""
        if not self.enabled:
            return
        kept = [json.dumps(r) for r in read_metrics(self.path) if r["step"] <= step]
        if self.path.exists():
            self.path.write_text("".join(line + "\n" for line in kept))


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [r for r in map(_parse, path.read_text().splitlines()) if r is not None]


def _parse(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None  # the tail of a line cut short by a killed process
    return record if isinstance(record, dict) and "step" in record else None
