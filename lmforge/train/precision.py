"""Precision policies: how the forward runs (fp32, bf16, fp16, fp8) and what that demands.

One policy object per run holds every precision-dependent choice, so the training loop has no
branches on precision: the autocast context, the loss scaler (fp16 only), the dtype the model
itself is cast to (`cast_module`, Megatron's Float16Module with fp32 master weights), the fp8
layers and the matmul dtype that MFU is measured against.

What stays fp32 in every policy: the master weights and the optimizer state and update (the
optimizer only ever sees fp32 parameters), RMSNorm statistics (`RMSNorm` computes in at least
fp32), attention softmax (SDPA accumulates in fp32) and the loss (the loop casts logits to fp32
before the log-softmax).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from lmforge.device.capability import cpu_capability
from lmforge.errors import LmforgeError
from lmforge.model import Transformer
from lmforge.train.config import PRECISIONS
from lmforge.train.fp8 import Float8Linear, convert_to_float8, real_fp8_supported
from lmforge.train.loss_scale import DynamicLossScaler


class Precision:
    """fp32 everywhere: the reference every other policy is measured against."""

    name = "fp32"
    dtype = torch.float32  # the dtype the forward's matmuls and activations use
    matmul = "fp32"  # the peak MFU is measured against
    castable = False  # whether the model itself may be cast to `dtype` (cast_module)

    def __init__(self, device: torch.device, cast_module: bool = False) -> None:
        if cast_module and not self.castable:
            raise LmforgeError(
                f"train.precision.cast_module needs precision bf16 or fp16, not {self.name}: "
                "change --precision or set train.precision.cast_module=false"
            )
        self.device = device
        self.cast_module = cast_module
        self.scaler: DynamicLossScaler | None = None

    @property
    def module_dtype(self) -> torch.dtype:
        """The dtype the compute copy of the model is cast to."""
        return self.dtype if self.cast_module else torch.float32

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def wrap(self, model: Transformer) -> nn.Module:
        """Precision changes to the compute model, applied before checkpointing and compile."""
        return model

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss if self.scaler is None else self.scaler.scale_loss(loss)

    def unscale_(self, grads: list[torch.Tensor]) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(grads)

    def end_step(self, bad_step: torch.Tensor) -> None:
        """Called after every optimizer step (taken or skipped)."""
        if self.scaler is not None:
            self.scaler.update(bad_step)

    def log_fields(self) -> dict[str, torch.Tensor]:
        """Device tensors the log line reads (on log steps only)."""
        return {} if self.scaler is None else {"loss_scale": self.scaler.scale}

    def state_dict(self) -> dict:
        return {} if self.scaler is None else {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def describe(self) -> str:
        return self.name + (" (cast module, fp32 master weights)" if self.cast_module else "")


class Autocast(Precision):
    """bf16: matmuls and most activations in bf16 under autocast, weights kept in fp32."""

    name = "bf16"
    dtype = torch.bfloat16
    matmul = "bf16"
    castable = True

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.cast_module:
            return contextlib.nullcontext()  # the module already computes in its own dtype
        return torch.autocast(self.device.type, dtype=self.dtype)

    def wrap(self, model: Transformer) -> nn.Module:
        return Float16Module(model, self.dtype) if self.cast_module else model


class LossScaled(Autocast):
    """fp16: as bf16, plus dynamic loss scaling against fp16's narrow exponent range."""

    name = "fp16"
    dtype = torch.float16
    matmul = "fp16"

    def __init__(self, device: torch.device, cast_module: bool = False) -> None:
        super().__init__(device, cast_module)
        self.scaler = DynamicLossScaler(device)


class Float8(Autocast):
    """fp8 matmuls in the transformer blocks (see fp8.py) and bf16 autocast around them."""

    name = "fp8"
    dtype = torch.bfloat16
    castable = False

    def __init__(self, device: torch.device, cast_module: bool = False) -> None:
        super().__init__(device, cast_module)
        self.real = real_fp8_supported(device)
        self.matmul = "fp8" if self.real else "bf16"  # the simulated path multiplies in bf16
        self.layers: list[Float8Linear] = []

    def wrap(self, model: Transformer) -> nn.Module:
        self.layers = convert_to_float8(model, real=self.real)
        return model

    def end_step(self, bad_step: torch.Tensor) -> None:
        for layer in self.layers:
            layer.update_scales(bad_step.to(layer.scales.device))

    def state_dict(self) -> dict:
        return {
            f"fp8.{i}.{name}": buffer.clone()
            for i, layer in enumerate(self.layers)
            for name, buffer in layer.named_buffers()
            if name != "limits"
        }

    def load_state_dict(self, state: dict) -> None:
        for i, layer in enumerate(self.layers):
            for name, buffer in layer.named_buffers():
                if f"fp8.{i}.{name}" in state:
                    buffer.copy_(state[f"fp8.{i}.{name}"])

    def describe(self) -> str:
        return "fp8 (" + ("torch._scaled_mm" if self.real else "simulated, bf16 matmuls") + ")"


class Float16Module(nn.Module):
    """Megatron's Float16Module: the wrapped model holds half weights; inputs are cast to half
    and outputs back to fp32. The optimizer steps fp32 master copies (see master.py)."""

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module
        self.dtype = dtype

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        args = tuple(a.to(self.dtype) if a.is_floating_point() else a for a in args)
        return self.module(*args, **kwargs).float()


_POLICIES: dict[str, type[Precision]] = {
    "fp32": Precision,
    "bf16": Autocast,
    "fp16": LossScaled,
    "fp8": Float8,
}


def make_precision(name: str, device: torch.device, cast_module: bool = False) -> Precision:
    """The policy for `name` (fp32, bf16, fp16, fp8 or auto) on `device`."""
    if name == "auto":
        name = auto_precision(device)
    if name not in _POLICIES:
        raise LmforgeError(
            f"unknown precision {name!r}: choose one of {', '.join(PRECISIONS)} or auto"
        )
    return _POLICIES[name](device, cast_module)


def auto_precision(device: torch.device) -> str:
    """bf16 where it is fast (a CUDA GPU that supports it, or a CPU whose measured bf16 matmul
    peak beats fp32 by half again: see lmforge.device.capability); fp32 everywhere else."""
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu" and cpu_capability().fast_bf16():
        return "bf16"
    return "fp32"
