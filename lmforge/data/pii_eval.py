"""Scoring the PII masker on a labelled set: precision and recall per type.

A case is one JSON line: `text`, `profile` (prose or code), `context` (where the PII sits:
sentence_final, url, code, trap, ...) and `pii`, a list of `[type, value]` pairs, the exact
substrings that must be masked (empty for traps). A found span counts as a true positive when
its type and its exact text match a labelled pair not yet matched in that case, so a span one
character too long is both a false positive and a false negative.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lmforge.data.pii import ALL_TYPES, find_pii


@dataclass
class TypeScore:
    tp: int = 0
    fp: int = 0
    fn: int = 0

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0


def load_cases(path: str | Path) -> list[dict]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def case_errors(case: dict) -> tuple[Counter, Counter, Counter]:
    """(true positives, false positives, false negatives) of one case, as (type, text) counts."""
    text = case["text"]
    found = Counter((kind, text[a:b]) for kind, a, b in find_pii(text, profile=case["profile"]))
    expected = Counter((kind, value) for kind, value in case["pii"])
    return found & expected, found - expected, expected - found


def score(cases: list[dict]) -> dict[str, TypeScore]:
    scores = {kind: TypeScore() for kind in ALL_TYPES}
    for case in cases:
        tp, fp, fn = case_errors(case)
        for counter, field in ((tp, "tp"), (fp, "fp"), (fn, "fn")):
            for (kind, _), n in counter.items():
                setattr(scores[kind], field, getattr(scores[kind], field) + n)
    return scores


def format_table(scores: dict[str, TypeScore], cases: list[dict]) -> str:
    """A Markdown table: labelled spans, spans found, errors, precision and recall per type."""
    labelled = Counter(kind for case in cases for kind, _ in case["pii"])
    rows = ["| type | labelled | found | false pos. | false neg. | precision | recall |"]
    rows.append("|---|---:|---:|---:|---:|---:|---:|")
    for kind, s in scores.items():
        rows.append(
            f"| {kind} | {labelled[kind]} | {s.tp + s.fp} | {s.fp} | {s.fn} "
            f"| {s.precision:.3f} | {s.recall:.3f} |"
        )
    return "\n".join(rows)
