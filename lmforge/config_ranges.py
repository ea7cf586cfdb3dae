"""The allowed range of every bounded numeric setting, checked as soon as a config is loaded.

A value out of range is a one-line error naming the key and its range, before any work starts,
instead of a failure deep inside torch (AdamW's "Invalid learning rate") minutes later. Keys
left out here (`model.vocab_size` aside) are choices or flags, checked by their own section.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
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

RANGES: dict[str, Range] = {
    "model.vocab_size": AT_LEAST_1,
    "model.d_model": AT_LEAST_1,
    "model.n_layers": AT_LEAST_1,
    "model.n_heads": AT_LEAST_1,
    "model.n_kv_heads": AT_LEAST_1,
    "model.d_ff": AT_LEAST_1,
    "model.max_seq_len": AT_LEAST_1,
    "model.rope_theta": POSITIVE,
    "model.norm_eps": POSITIVE,
    "model.n_experts": NON_NEGATIVE,
    "model.experts_per_token": AT_LEAST_1,
    "tokenizer.vocab_size": Range(256),  # the 256 byte tokens come first
    "tokenizer.train_bytes": NON_NEGATIVE,
    "data.val_fraction": FRACTION,
    "data.workers": NON_NEGATIVE,
    "train.batch_size": AT_LEAST_1,
    "train.seq_len": AT_LEAST_1,
    "train.grad_accum_steps": AT_LEAST_1,
    "train.lr": POSITIVE,
    "train.min_lr_ratio": Range(0, 1, high_open=False),
    "train.warmup_steps": NON_NEGATIVE,
    "train.warmup_frac": Range(0, 1, high_open=False),
    "train.decay_frac": FRACTION,
    "train.max_steps": NON_NEGATIVE,
    "train.minutes": NON_NEGATIVE,
    "train.weight_decay": NON_NEGATIVE,
    "train.beta1": FRACTION,
    "train.beta2": FRACTION,
    "train.muon_lr": POSITIVE,
    "train.muon_momentum": FRACTION,
    "train.embed_lr": NON_NEGATIVE,  # 0: lr
    "train.grad_clip": NON_NEGATIVE,  # 0: no clipping
    "train.eval_every": NON_NEGATIVE,  # 0: no periodic evaluation
    "train.eval_batches": AT_LEAST_1,
    "train.log_every": AT_LEAST_1,
    "train.checkpoint_every": NON_NEGATIVE,  # 0: only at the end
    "train.seed": NON_NEGATIVE,
    "train.max_bad_steps": AT_LEAST_1,
    "train.ddp_bucket_mb": POSITIVE,
    "train.collective_timeout_s": POSITIVE,
}


def check_ranges(cfg: Any) -> None:
    """Raise a one-line LmforgeError for the first numeric setting of `cfg` (a RunConfig) that
    is not a finite number in its range."""
    for key, allowed in RANGES.items():
        section, name = key.split(".")
        part = getattr(cfg, section, None)
        if part is None or name not in {f.name for f in dataclasses.fields(part)}:
            continue
        value = getattr(part, name)
        if value is None:  # None means "the default" where a key allows it
            continue
        if not math.isfinite(value) or value not in allowed:
            raise LmforgeError(f"{key} is {value!r}: it must be {allowed} (--set {key}=VALUE)")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
