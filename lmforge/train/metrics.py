"""`metrics.jsonl`: one JSON object per logged step, the same keys in every command that trains."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    """Appends one line per record and flushes it, so a crash loses at most the line in flight."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, **record: float | int | str) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop records past `step`: a resumed run rewrites the steps it repeats."""
        if not self.path.exists():
            return
        kept = [
            line for line in self.path.read_text().splitlines() if json.loads(line)["step"] <= step
        ]
        self.path.write_text("".join(line + "\n" for line in kept))


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
