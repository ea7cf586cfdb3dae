"""The trainer's settings: a torch-free dataclass, so configs load and validate without torch."""

from __future__ import annotations

from dataclasses import dataclass

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
class TrainConfig:
    batch_size: int = ranged(16, AT_LEAST_1)
    seq_len: int = ranged(256, AT_LEAST_1)
    grad_accum_steps: int = ranged(1, AT_LEAST_1)
    lr: float = ranged(3e-3, POSITIVE)
    min_lr_ratio: float = ranged(0.1, Range(0, 1, high_open=False))
    schedule: str = one_of("wsd", SCHEDULES)  # wsd (warmup, peak, linear decay) | cosine
    warmup_frac: float = ranged(0.05, Range(0, 1, high_open=False))  # at most warmup_steps
    warmup_steps: int = ranged(50, NON_NEGATIVE)
    decay_frac: float = ranged(0.2, FRACTION)  # wsd: the share of the run spent decaying
    max_steps: int = ranged(0, NON_NEGATIVE)  # 0: train for `minutes` of wall-clock time
    minutes: float = ranged(0.0, NON_NEGATIVE)
    weight_decay: float = ranged(0.1, NON_NEGATIVE)
    beta1: float = ranged(0.9, FRACTION)
    beta2: float = ranged(0.95, FRACTION)
    grad_clip: float = ranged(1.0, NON_NEGATIVE)  # 0: no clipping
    eval_every: int = ranged(100, NON_NEGATIVE)  # 0: no periodic evaluation
    eval_batches: int = ranged(16, AT_LEAST_1)
    eval_tasks: str = ""  # tasks scored at each validation, e.g. "code" (see `lmforge eval`)
    log_every: int = ranged(10, AT_LEAST_1)
    checkpoint_every: int = ranged(0, NON_NEGATIVE)  # 0: only at the end (and on Ctrl-C)
    seed: int = ranged(1337, NON_NEGATIVE)
    device: str = "auto"
    precision: str = one_of("fp32", (*PRECISIONS, "auto"))  # auto: bf16 where it is fast
    cast_module: bool = False  # bf16/fp16: cast the model itself, step fp32 master copies
    activation_checkpointing: str = one_of("none", CHECKPOINTING_MODES)
    compile: bool = False
    fused_adamw: bool = True  # PyTorch's fused AdamW kernel where the device has one
    optimizer: str = one_of("adamw", OPTIMIZERS)  # muon: Muon for the blocks' matrices
    muon_lr: float = ranged(0.02, POSITIVE)  # optimizer=muon: the matrices' peak lr
    muon_momentum: float = ranged(0.95, FRACTION)  # optimizer=muon: (Nesterov) momentum
    embed_lr: float = ranged(0.0, NON_NEGATIVE)  # the input embedding's AdamW peak lr (0: lr)
    offload_optimizer: bool = False  # optimizer state and master weights on the CPU
    max_bad_steps: int = ranged(25, AT_LEAST_1)  # stop after this many non-finite in a row
    loader: str = one_of("random", LOADERS)
    document_mask: bool = False  # attention stays inside each packed document
    fused_loss: bool = False  # head and cross-entropy fused per chunk: no full logits
    kernels: str = one_of("torch", KERNEL_CHOICES)  # triton: RMSNorm, SwiGLU, RoPE, attention
    parallel: str = ""  # under torchrun, e.g. "dp=2,tp=2" or "fsdp=4"; the rest is dp
    ddp_bucket_mb: float = ranged(25.0, POSITIVE)  # DDP: gradients all-reduced in buckets
    zero1: bool = False  # DDP: shard the optimizer state over the dp ranks (ZeRO-1)
    reshard_after_forward: bool = True  # FSDP: free gathered weights after forward (ZeRO-3)
    sequence_parallel: bool = True  # TP: shard norms' tokens, reduce-scatter not all-reduce
    collective_timeout_s: float = ranged(600.0, POSITIVE)  # a collective waiting longer fails

    def validate(self) -> None:
        check_fields(self, "train")
        parse_layout(self.parallel)
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
        if self.embed_lr and model.tie_embeddings:
            raise LmforgeError(
                "train.embed_lr is set but model.tie_embeddings shares the embedding with the "
                "output head: set train.embed_lr=0 (one learning rate for both) or untie them"
            )
