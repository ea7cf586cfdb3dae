"""The trainer's settings: torch-free dataclasses, so configs load and validate without torch.

`TrainConfig` holds what is about the whole run (its batch, length, seed, device, logging) and
one section per component that the run builds, each a small dataclass whose docstring names
the code that reads it:

    [train.optimizer]   the optimizer: lmforge/train/optimizers.py (AdamW, Muon, offload)
    [train.schedule]    the learning-rate schedule: lmforge/train/schedule.py
    [train.precision]   the numeric precision: lmforge/train/precision.py (`make_precision`)
    [train.compute]     how the model computes: lmforge/train/compose.py (`compose`)
    [train.parallel]    the parallel layout: lmforge/parallel/ and lmforge/train/distributed.py
    [train.checkpoint]  periodic checkpoints: lmforge/train/checkpointer.py
    [train.eval]        periodic validation: lmforge/train/validator.py, lmforge/eval/periodic.py
    [train.loader]      the training batches: lmforge/train/batches.py (`make_batches`)

Each range is declared once on its field (`ranged`/`one_of`) and checked once by
`TrainConfig.validate`, under the field's full key (`train.optimizer.lr`).

Configs written before the sections existed used flat keys (`[train] lr = 3e-3`,
`--set train.lr=3e-3`); `FLAT_KEYS` maps each one to its new place and `nest_train` moves a
flat `[train]` table into its sections, so old TOML files, `--set` keys and run folders keep
working.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lmforge.config_ranges import (
    AT_LEAST_1,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    Range,
    check_fields,
    one_of,
    ranged,
)
from lmforge.errors import LmforgeError
from lmforge.model.config import ModelConfig
from lmforge.parallel.layout import parse_layout
from lmforge.train.schedule import SCHEDULES

PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
CHECKPOINTING_MODES = ("none", "full", "selective")
LOADERS = ("random", "sequential")
OPTIMIZERS = ("adamw", "muon")
KERNEL_CHOICES = ("torch", "triton")


@dataclass
class OptimizerConfig:
    """The optimizer (lmforge/train/optimizers.py builds it): AdamW or Muon, their settings,
    gradient clipping (applied to the gradients the optimizer steps on) and where its state
    lives."""

    name: str = one_of("adamw", OPTIMIZERS)  # muon: Muon for the blocks' matrices
    lr: float = ranged(3e-3, POSITIVE)  # the peak learning rate
    weight_decay: float = ranged(0.1, NON_NEGATIVE)
    beta1: float = ranged(0.9, FRACTION)
    beta2: float = ranged(0.95, FRACTION)
    grad_clip: float = ranged(1.0, NON_NEGATIVE)  # 0: no clipping
    fused_adamw: bool = True  # PyTorch's fused AdamW kernel where the device has one
    muon_lr: float = ranged(0.02, POSITIVE)  # name=muon: the matrices' peak lr
    muon_momentum: float = ranged(0.95, FRACTION)  # name=muon: (Nesterov) momentum
    embed_lr: float = ranged(0.0, NON_NEGATIVE)  # the input embedding's AdamW peak lr (0: lr)
    offload: bool = False  # optimizer state and master weights on the CPU


@dataclass
class ScheduleConfig:
    """The learning-rate schedule (lmforge/train/schedule.py): warmup, then WSD or cosine."""

    kind: str = one_of("wsd", SCHEDULES)  # wsd (warmup, peak, linear decay) | cosine
    min_lr_ratio: float = ranged(0.1, Range(0, 1, high_open=False))
    warmup_frac: float = ranged(0.05, Range(0, 1, high_open=False))  # at most warmup_steps
    warmup_steps: int = ranged(50, NON_NEGATIVE)
    decay_frac: float = ranged(0.2, FRACTION)  # wsd: the share of the run spent decaying


@dataclass
class PrecisionConfig:
    """The numeric precision (lmforge/train/precision.py's `make_precision` builds it from
    these two): autocast, loss scaling, fp8 matmuls, or a cast model with master weights."""

    dtype: str = one_of("fp32", (*PRECISIONS, "auto"))  # auto: bf16 where it is fast
    cast_module: bool = False  # bf16/fp16: cast the model itself, step fp32 master copies


@dataclass
class ComputeConfig:
    """How the model computes its forward and backward: `compose` (lmforge/train/compose.py)
    applies all four to the model it wraps for training. Apart from [train.precision]
    because they change the kernels and memory of the same arithmetic, not its numbers."""

    activation_checkpointing: str = one_of("none", CHECKPOINTING_MODES)
    compile: bool = False  # torch.compile each transformer block
    kernels: str = one_of("torch", KERNEL_CHOICES)  # triton: RMSNorm, SwiGLU, RoPE, attention
    fused_loss: bool = False  # head and cross-entropy fused per chunk: no full logits


@dataclass
class ParallelConfig:
    """The parallel layout under torchrun and its strategies' knobs (lmforge/parallel/layout.py
    reads the layout, lmforge/train/distributed.py builds DDP, FSDP and TP from the rest)."""

    layout: str = ""  # under torchrun, e.g. "dp=2,tp=2" or "fsdp=4"; the rest is dp
    ddp_bucket_mb: float = ranged(25.0, POSITIVE)  # DDP: gradients all-reduced in buckets
    zero1: bool = False  # DDP: shard the optimizer state over the dp ranks (ZeRO-1)
    reshard_after_forward: bool = True  # FSDP: free gathered weights after forward (ZeRO-3)
    sequence_parallel: bool = True  # TP: shard norms' tokens, reduce-scatter not all-reduce
    collective_timeout_s: float = ranged(600.0, POSITIVE)  # a collective waiting longer fails


@dataclass
class CheckpointConfig:
    """Periodic checkpoints (lmforge/train/checkpointer.py writes them)."""

    every: int = ranged(0, NON_NEGATIVE)  # 0: only at the end (and on Ctrl-C)


@dataclass
class EvalConfig:
    """Periodic validation during training (lmforge/train/validator.py; the tasks by
    lmforge/eval/periodic.py)."""

    every: int = ranged(100, NON_NEGATIVE)  # 0: no periodic evaluation
    batches: int = ranged(16, AT_LEAST_1)
    tasks: str = ""  # tasks scored at each validation, e.g. "code" (see `lmforge eval`)


@dataclass
class LoaderConfig:
    """The training batches (lmforge/train/batches.py's `make_batches` builds their loader)."""

    kind: str = one_of("random", LOADERS)  # sequential: the shards in a seeded order
    document_mask: bool = False  # attention stays inside each packed document


@dataclass
class TrainConfig:
    batch_size: int = ranged(16, AT_LEAST_1)
    seq_len: int = ranged(256, AT_LEAST_1)
    grad_accum_steps: int = ranged(1, AT_LEAST_1)
    max_steps: int = ranged(0, NON_NEGATIVE)  # 0: train for `minutes` of wall-clock time
    minutes: float = ranged(0.0, NON_NEGATIVE)
    log_every: int = ranged(10, AT_LEAST_1)
    seed: int = ranged(1337, NON_NEGATIVE)
    device: str = "auto"
    # The run stops after this many non-finite steps in a row (lmforge/train/guard.py, which
    # the training loop itself consults: no component of its own).
    max_bad_steps: int = ranged(25, AT_LEAST_1)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)

    def validate(self) -> None:
        check_fields(self, "train")
        parse_layout(self.parallel.layout)
        if self.max_steps <= 0 and self.minutes <= 0:
            raise LmforgeError("train.max_steps and train.minutes are both 0: set one of them")

    def check_model(self, model: ModelConfig) -> None:
        """Refuse settings that do not fit `model`: the training context and the embedding's
        own learning rate."""
        if self.seq_len > model.max_seq_len:
            raise LmforgeError(
                f"train.seq_len {self.seq_len} exceeds model.max_seq_len {model.max_seq_len}: "
                "lower train.seq_len or raise model.max_seq_len"
            )
        if self.optimizer.embed_lr and model.tie_embeddings:
            raise LmforgeError(
                "train.optimizer.embed_lr is set but model.tie_embeddings shares the embedding "
                "with the output head: set train.optimizer.embed_lr=0 (one learning rate for "
                "both) or untie them"
            )


FLAT_KEYS = {
    "lr": "optimizer.lr",
    "weight_decay": "optimizer.weight_decay",
    "beta1": "optimizer.beta1",
    "beta2": "optimizer.beta2",
    "grad_clip": "optimizer.grad_clip",
    "fused_adamw": "optimizer.fused_adamw",
    "optimizer": "optimizer.name",
    "muon_lr": "optimizer.muon_lr",
    "muon_momentum": "optimizer.muon_momentum",
    "embed_lr": "optimizer.embed_lr",
    "offload_optimizer": "optimizer.offload",
    "schedule": "schedule.kind",
    "min_lr_ratio": "schedule.min_lr_ratio",
    "warmup_frac": "schedule.warmup_frac",
    "warmup_steps": "schedule.warmup_steps",
    "decay_frac": "schedule.decay_frac",
    "precision": "precision.dtype",
    "cast_module": "precision.cast_module",
    "activation_checkpointing": "compute.activation_checkpointing",
    "compile": "compute.compile",
    "kernels": "compute.kernels",
    "fused_loss": "compute.fused_loss",
    "parallel": "parallel.layout",
    "ddp_bucket_mb": "parallel.ddp_bucket_mb",
    "zero1": "parallel.zero1",
    "reshard_after_forward": "parallel.reshard_after_forward",
    "sequence_parallel": "parallel.sequence_parallel",
    "collective_timeout_s": "parallel.collective_timeout_s",
    "checkpoint_every": "checkpoint.every",
    "eval_every": "eval.every",
    "eval_batches": "eval.batches",
    "eval_tasks": "eval.tasks",
    "loader": "loader.kind",
    "document_mask": "loader.document_mask",
}
"""Each key of the flat [train] table of configs written before the sections → its place now
(under train.). Four old keys are also section names (optimizer, schedule, precision,
parallel): a value that is not a table is the old key."""


def nest_train(values: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """`values` (a [train] table) with each old flat key moved into its section, and the
    (old, new) keys moved. A key given both ways keeps the section's value."""
    old = {k: v for k, v in values.items() if k in FLAT_KEYS and not isinstance(v, dict)}
    nested = {k: dict(v) if isinstance(v, dict) else v for k, v in values.items() if k not in old}
    for key, value in old.items():
        section, name = FLAT_KEYS[key].split(".")
        table = nested.setdefault(section, {})
        if isinstance(table, dict):
            table.setdefault(name, value)
    moved = [(key, FLAT_KEYS[key]) for key in old]
    return nested, moved


def train_config(values: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from a [train] table's values: nested (`{"optimizer": {"lr": 1e-3}}`) or,
    as configs written before the sections, flat (`{"lr": 1e-3}`, moved by `nest_train`)."""
    sections = {
        f.name: f.default_factory
        for f in dataclasses.fields(TrainConfig)
        if f.default_factory is not dataclasses.MISSING
    }
    nested, _ = nest_train(values)
    return TrainConfig(
        **{k: sections[k](**v) if k in sections else v for k, v in nested.items()}  # type: ignore[misc]
    )
