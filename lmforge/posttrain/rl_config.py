"""GRPO's settings, torch-free, so `lmforge rl` checks them before torch is imported.

The defaults follow TRL's GRPOTrainer and DAPO where they agree (temperature 1, group-scaled
advantages, clip-higher 0.2/0.28, no KL, token-level `dapo` normalisation, dynamic sampling),
with a learning rate sized to the model's width (`width_scaled_lr`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lmforge.errors import LmforgeError
from lmforge.parallel.layout import parse_layout
from lmforge.train.config import CHECKPOINTING_MODES

DYNAMIC_SAMPLING = ("drop", "count")
SCALES = ("group", "batch", "none")
NORMS = ("dapo", "grpo", "dr_grpo")
REFERENCE_LR, REFERENCE_WIDTH = 2e-5, 256


def width_scaled_lr(d_model: int) -> float:
    """GRPO's peak learning rate for a model `d_model` wide: 2e-5 at width 256, scaled as
    1/width (muP's rule for Adam on hidden matrices). Measured on the chat speedrun (README):
    at 256, 5e-5 lowered greedy accuracy by 0.1; at 128, 3e-4 collapsed it."""
    return REFERENCE_LR * REFERENCE_WIDTH / d_model


@dataclass(frozen=True)
class RlConfig:
    task: str = "arithmetic"
    steps: int = 100  # optimizer steps (num_iterations per rollout batch)
    minutes: float = 0.0  # a time budget instead of `steps` (checked between rollout batches)
    prompts_per_step: int = 16  # groups of a rollout batch
    group_size: int = 8  # G completions per prompt
    max_new_tokens: int = 96
    temperature: float = 1.0
    top_k: int = 0  # 0: the whole vocabulary
    num_iterations: int = 1  # optimizer steps per rollout batch (stored old log-probs)
    lr: float = 0.0  # peak; 0: `width_scaled_lr` of the model's d_model
    warmup_steps: int = 5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch: int = 32  # completions per forward/backward
    scale_rewards: str = "group"  # group | batch | none (Dr.GRPO)
    loss_norm: str = "dapo"  # dapo | grpo | dr_grpo
    eps_low: float = 0.2
    eps_high: float = 0.28
    beta: float = 0.0  # KL to the starting model (k3); 0 keeps no reference model
    dynamic_sampling: str = "drop"  # drop zero-variance groups and draw more, or count them
    max_refills: int = 4  # dynamic sampling: extra rollout rounds per step at most
    eval_every: int = 25  # held-out accuracy every N steps (0: only at the start and end)
    eval_problems: int = 500
    eval_samples: int = 4  # sampled completions per test problem (pass@1 at `temperature`)
    eval_seed: int = 1234  # the fixed held-out problems
    train_problems: int = 4000  # the pool prompts are drawn from
    checkpoint_every: int = 25
    seed: int = 0
    precision: str = "fp32"
    device: str = "auto"
    engine_batch: int = 128  # the engine's decode slots (a 16 x 8 round at once)
    # Settings of the shared training core (train/compose.py, train/step.py), added later:
    # recorded in rl_config.json only where they differ from these defaults (`recorded`).
    beta1: float = 0.9  # AdamW's betas
    beta2: float = 0.99
    max_bad_steps: int = 25  # stop after this many non-finite optimizer steps in a row
    parallel: str = ""  # under torchrun: dp=N or fsdp=N (the rest of the world is dp)
    activation_checkpointing: str = "none"  # none | full | selective
    compile: bool = False  # torch.compile per transformer block (the policy's training copy)
    collective_timeout_s: float = 600.0  # a collective waiting longer fails (a rank died)

    def validate(self) -> None:
        positive = (
            "prompts_per_step", "max_new_tokens", "num_iterations", "micro_batch",
            "eval_problems", "train_problems", "engine_batch",
        )  # fmt: skip
        for name in positive:
            if getattr(self, name) < 1:
                raise LmforgeError(f"rl.{name} is {getattr(self, name)}: use 1 or more")
        if self.group_size < 2:
            raise LmforgeError(
                f"--group-size is {self.group_size}: GRPO compares completions of one prompt, "
                "so use 2 or more (8 is usual)"
            )
        if self.steps < 1 and self.minutes <= 0:
            raise LmforgeError("rl needs steps >= 1 or a time budget (--minutes)")
        if self.temperature <= 0:
            raise LmforgeError(
                f"rl.temperature is {self.temperature}: sample with a temperature above 0"
            )
        for name, value, allowed in (
            ("scale_rewards", self.scale_rewards, SCALES),
            ("loss_norm", self.loss_norm, NORMS),
            ("dynamic_sampling", self.dynamic_sampling, DYNAMIC_SAMPLING),
        ):
            if value not in allowed:
                raise LmforgeError(f"rl.{name} is {value!r}: choose one of {', '.join(allowed)}")
        if self.lr < 0 or self.eps_low < 0 or self.eps_high < 0 or self.beta < 0:
            raise LmforgeError(
                "rl.lr (0: scaled to the model's width), eps_low, eps_high and beta must be "
                "at least 0"
            )
        self._validate_core()

    def _validate_core(self) -> None:
        """The shared training core's settings."""
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise LmforgeError(
                f"rl.beta1 and rl.beta2 are {self.beta1} and {self.beta2}: AdamW's betas lie "
                "in [0, 1)"
            )
        if self.max_bad_steps < 1 or self.collective_timeout_s <= 0:
            raise LmforgeError(
                "rl.max_bad_steps must be at least 1 and rl.collective_timeout_s above 0, got "
                f"{self.max_bad_steps} and {self.collective_timeout_s}"
            )
        if self.activation_checkpointing not in CHECKPOINTING_MODES:
            raise LmforgeError(
                f"rl.activation_checkpointing is {self.activation_checkpointing!r}: choose one "
                f"of {', '.join(CHECKPOINTING_MODES)}"
            )
        unsupported = sorted(set(parse_layout(self.parallel)) - {"dp", "fsdp"})
        if unsupported:
            raise LmforgeError(
                f"--parallel {self.parallel}: rl trains with data parallelism only (dp, fsdp), "
                f"not {', '.join(unsupported)}: use e.g. --parallel fsdp=2"
            )


ADDED_LATER = {
    "beta1": 0.9, "beta2": 0.99, "max_bad_steps": 25, "parallel": "",
    "activation_checkpointing": "none", "compile": False, "collective_timeout_s": 600.0,
}  # fmt: skip
"""Settings an rl run folder of an earlier release does not record, with the values it ran
with: left out of `recorded` at these values, so such a folder still resumes."""


def recorded(cfg: RlConfig) -> dict:
    """`cfg` as rl_config.json records it: every setting, except those of `ADDED_LATER` that
    keep the value runs had before they could be set."""
    return {
        k: v
        for k, v in dataclasses.asdict(cfg).items()
        if k not in ADDED_LATER or v != ADDED_LATER[k]
    }


def with_settings(cfg: RlConfig, items: list[str]) -> RlConfig:
    """`cfg` with `rl.KEY=VALUE` settings applied, each value parsed as its field's type."""
    fields = {f.name: f for f in dataclasses.fields(RlConfig)}
    changes = {}
    for item in items:
        key, sep, text = item.strip().partition("=")
        name = key.removeprefix("rl.")
        if not sep or not key.startswith("rl.") or name not in fields:
            raise LmforgeError(
                f"--set {item!r}: rl takes rl.KEY=VALUE with KEY one of {', '.join(fields)}"
            )
        kind = type(getattr(cfg, name))
        if kind is bool:
            if text.strip().lower() not in ("true", "false", "1", "0"):
                raise LmforgeError(f"--set {item!r}: {name} takes true or false")
            changes[name] = text.strip().lower() in ("true", "1")
            continue
        try:
            changes[name] = kind(float(text)) if kind in (int, float) else text
        except ValueError:
            raise LmforgeError(f"--set {item!r}: {name} takes a number") from None
    return dataclasses.replace(cfg, **changes)
