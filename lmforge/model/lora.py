"""LoRA: low-rank adapters on a frozen Transformer's projections (Hu et al. 2021).

A targeted `Linear` becomes a `LoraLinear` that keeps the frozen `weight` under the same name
and adds `lora_A` (r × in, Kaiming-uniform as PEFT initialises it) and `lora_B` (out × r,
zero), so step 0 computes exactly the base model:

    y = x Wᵀ + scaling · dropout(x) Aᵀ Bᵀ,   scaling = α / r   (rsLoRA: α / √r)

Merging adds scaling · B A into W (and unmerging takes it out again); `merge_lora` merges and
turns every adapter back into a plain `Linear`, so inference, export and quantization see an
ordinary model. The settings are model/lora_spec.py's (torch-free); the PEFT file format of
the adapters is model/peft.py's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.model.layers import Linear
from lmforge.model.lora_spec import TARGETS, LoraSpec


class LoraLinear(Linear):
    """A frozen Linear plus its trainable low-rank update."""

    def __init__(self, base: Linear, spec: LoraSpec) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.weight.requires_grad_(False)
        self.scaling = spec.scaling
        self.r = spec.r
        like = {"device": self.weight.device, "dtype": self.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(spec.r, self.in_features, **like))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, spec.r, **like))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's and PEFT's init
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout else nn.Identity()
        self.merged = False

    def reset_parameters(self) -> None:
        pass  # the base weight is given; the adapters are initialised in __init__

    def delta(self) -> torch.Tensor:
        """scaling · B A: what merging adds to the weight."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.merged:
            return y
        update = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)
        return y + update * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        if not self.merged:
            self.weight += self.delta().to(self.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        if self.merged:
            self.weight -= self.delta().to(self.weight.dtype)
            self.merged = False

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, r={self.r}, scaling={self.scaling:g}"


def apply_lora(model: nn.Module, spec: LoraSpec) -> nn.Module:
    """Freeze every parameter of `model` (a Transformer) and wrap its targeted projections in
    LoraLinear; the adapters alone train. Returns the model, changed in place."""
    if any(True for _ in lora_modules(model)):
        raise LmforgeError("this model already has LoRA adapters: apply LoRA once")
    for p in model.parameters():
        p.requires_grad_(False)
    for block in model.layers:
        for short in spec.targets:
            parent_name, child = TARGETS[short].split(".")
            parent = getattr(block, parent_name)
            base = getattr(parent, child, None)
            if not isinstance(base, Linear):
                raise LmforgeError(
                    f"LoRA target {short!r} is not a dense projection in this model (a mixture "
                    "of experts has no single mlp projections): target the attention instead"
                )
            setattr(parent, child, LoraLinear(base, spec))
    model.lora_spec = spec
    return model


def lora_modules(model: nn.Module) -> Iterator[tuple[str, LoraLinear]]:
    for name, module in model.named_modules():
        if isinstance(module, LoraLinear):
            yield name, module


def lora_spec_of(model: nn.Module) -> LoraSpec | None:
    return getattr(model, "lora_spec", None)


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters alone, under the model's own names (`layers.0.attn.q_proj.lora_A`)."""
    return {
        f"{name}.{part}": getattr(module, part).detach()
        for name, module in lora_modules(model)
        for part in ("lora_A", "lora_B")
    }


def set_merged(model: nn.Module, merged: bool) -> None:
    """Merge every adapter into its weight, or take them out again."""
    for _, module in lora_modules(model):
        module.merge() if merged else module.unmerge()


def merge_lora(model: nn.Module) -> nn.Module:
    """Merge the adapters into their weights and put plain Linears back (PEFT's
    `merge_and_unload`). Returns the model, changed in place; a model without adapters is
    returned as it is."""
    for name, module in list(lora_modules(model)):
        module.merge()
        parent_name, child = name.rsplit(".", 1)
        with torch.device("meta"):
            plain = Linear(module.in_features, module.out_features)
        plain.weight = module.weight
        setattr(model.get_submodule(parent_name), child, plain)
    if hasattr(model, "lora_spec"):
        del model.lora_spec
    return model


def count_trainable(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
