"""Allowed ranges and choices of settings, declared once on each config field, checked once.

A config section declares a bounded number as `ranged(default, Range)` and a choice as
`one_of(default, choices)`; `check_fields` checks a section against its declarations and
`check_ranges` every section of a run's config, as soon as it is loaded. A value out of range
is a one-line error naming the key and its range, before any work starts, instead of a failure
deep inside torch (AdamW's "Invalid learning rate") minutes later.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from lmforge.errors import LmforgeError


@dataclass(frozen=True)
class Range:
    low: float
    high: float = math.inf
    low_open: bool = False  # the low end itself is excluded
    high_open: bool = True

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"above {_num(self.low)}" if self.low_open else f"at least {_num(self.low)}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{_num(self.low)}, {_num(self.high)}{right}"


POSITIVE = Range(0, low_open=True)
AT_LEAST_1 = Range(1)
NON_NEGATIVE = Range(0)
FRACTION = Range(0, 1)  # [0, 1)


def ranged(default: Any, allowed: Range) -> Any:
    """A dataclass field whose numeric value must lie in `allowed` (checked by `check_fields`)."""
    return field(default=default, metadata={"range": allowed})


def one_of(default: str, choices: tuple[str, ...]) -> Any:
    """A dataclass field whose value must be one of `choices` (checked by `check_fields`)."""
    return field(default=default, metadata={"choices": choices})


def check_fields(section: Any, prefix: str) -> None:
    """Raise a one-line LmforgeError for the first field of the dataclass `section` (config
    section `prefix`) outside the range or choices its field declares, nested sections
    included (under `prefix.name`). None means "the default" where a field allows it."""
    for f in dataclasses.fields(section):
        value, key = getattr(section, f.name), f"{prefix}.{f.name}"
        if dataclasses.is_dataclass(value):  # a nested section: train.optimizer.name
            check_fields(value, key)
            continue
        allowed = f.metadata.get("range")
        if allowed is not None and value is not None and not _within(value, allowed):
            raise LmforgeError(f"{key} is {value!r}: it must be {allowed} (--set {key}=VALUE)")
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise LmforgeError(f"{key} is {value!r}: choose one of {', '.join(choices)}")


def check_ranges(cfg: Any) -> None:
    """`check_fields` on every section of `cfg` (a RunConfig): model, tokenizer, data, train."""
    for f in dataclasses.fields(cfg):
        part = getattr(cfg, f.name)
        if dataclasses.is_dataclass(part):
            check_fields(part, f.name)


def _within(value: float, allowed: Range) -> bool:
    return math.isfinite(value) and value in allowed


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
