"""The trainer's settings: a torch-free dataclass, so configs load and validate without torch."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.errors import LmforgeError
from lmforge.parallel.layout import parse_layout
from lmforge.train.schedule import SCHEDULES

PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
CHECKPOINTING_MODES = ("none", "full", "selective")
LOADERS = ("random", "sequential")
OPTIMIZERS = ("adamw", "muon")
KERNEL_CHOICES = ("torch", "triton")


@dataclass
class TrainConfig:
    batch_size: int = 16
    seq_len: int = 256
    grad_accum_steps: int = 1
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    schedule: str = "wsd"  # wsd (warmup, stable peak, linear decay) | cosine
    warmup_frac: float = 0.05  # warmup: this share of the run, at most warmup_steps
    warmup_steps: int = 50
    decay_frac: float = 0.2  # wsd: the share of the run spent decaying to the floor
    max_steps: int = 0  # 0: train for `minutes` of wall-clock time instead
    minutes: float = 0.0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 16
    eval_tasks: str = ""  # tasks scored at each validation, e.g. "code" (see `lmforge eval`)
    log_every: int = 10
    checkpoint_every: int = 0  # 0: only at the end (and on Ctrl-C)
    seed: int = 1337
    device: str = "auto"
    precision: str = "fp32"  # fp32 | bf16 | fp16 | fp8 | auto (bf16 where it is fast)
    cast_module: bool = False  # bf16/fp16: cast the model itself, step fp32 master copies
    activation_checkpointing: str = "none"  # none | full | selective
    compile: bool = False
    fused_adamw: bool = True  # PyTorch's fused AdamW kernel where the device has one
    optimizer: str = "adamw"  # adamw | muon (Muon for the blocks' matrices, AdamW for the rest)
    muon_lr: float = 0.02  # optimizer=muon: the matrices' peak learning rate (lr: the rest's)
    muon_momentum: float = 0.95  # optimizer=muon: the matrices' (Nesterov) momentum
    embed_lr: float = 0.0  # the input embedding's AdamW peak learning rate (0: lr)
    offload_optimizer: bool = False  # optimizer state and master weights on the CPU
    max_bad_steps: int = 25  # stop after this many non-finite steps in a row
    loader: str = "random"  # random | sequential
    document_mask: bool = False  # attention stays inside each packed document
    fused_loss: bool = False  # head and cross-entropy fused per chunk: no full logits in memory
    kernels: str = "torch"  # torch | triton (RMSNorm, SwiGLU, RoPE, attention by Triton, on a GPU)
    parallel: str = ""  # under torchrun, e.g. "dp=2,tp=2" or "fsdp=4"; the rest of the world is dp
    ddp_bucket_mb: float = 25.0  # DDP: gradients all-reduced in buckets this big during backward
    zero1: bool = False  # DDP: shard the optimizer state over the dp ranks (ZeRO-1)
    reshard_after_forward: bool = True  # FSDP: free gathered weights after forward (ZeRO-3)
    sequence_parallel: bool = True  # TP: shard norms' tokens, reduce-scatter instead of all-reduce
    collective_timeout_s: float = 600.0  # a collective waiting longer fails (e.g. a rank died)

    def validate(self) -> None:
        parse_layout(self.parallel)
        if self.ddp_bucket_mb <= 0 or self.collective_timeout_s <= 0:
            raise LmforgeError(
                "train.ddp_bucket_mb and train.collective_timeout_s must be above 0, got "
                f"{self.ddp_bucket_mb} and {self.collective_timeout_s}"
            )
        if self.max_steps <= 0 and self.minutes <= 0:
            raise LmforgeError("train.max_steps and train.minutes are both 0: set one of them")
        for name in (
            "batch_size",
            "seq_len",
            "grad_accum_steps",
            "log_every",
            "eval_batches",
            "max_bad_steps",
        ):
            if getattr(self, name) < 1:
                raise LmforgeError(f"train.{name} must be at least 1, got {getattr(self, name)}")
        for name, choices in (
            ("precision", (*PRECISIONS, "auto")),
            ("activation_checkpointing", CHECKPOINTING_MODES),
            ("loader", LOADERS),
            ("optimizer", OPTIMIZERS),
            ("schedule", SCHEDULES),
            ("kernels", KERNEL_CHOICES),
        ):
            if getattr(self, name) not in choices:
                raise LmforgeError(
                    f"train.{name} is {getattr(self, name)!r}: choose one of {', '.join(choices)}"
                )
