"""Quantize a Transformer in place: every block's Linear becomes a QuantizedLinear.

The method decides how the codes are chosen: RTN rounds each weight to its nearest level; AWQ
first rescales the weights' input channels by activation statistics (folding the inverse into the
op before, so the float model is unchanged) and then rounds; GPTQ chooses the codes column by
column against calibration activations. The embedding, the output head (unless quantize_head)
and MoE routers keep their dtype: they are a small share of the bytes and the most sensitive.
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.model.layers import Linear
from lmforge.model.transformer import Transformer
from lmforge.quant.linear import QuantizedLinear
from lmforge.quant.schemes import GROUP_SIZES, QuantizedWeight, check_shape, quantize

METHODS = ("rtn", "awq", "gptq")


def quantized_names(model: Transformer, quantize_head: bool = False) -> list[str]:
    """The Linears a quantized model stores as integers, by module name."""
    names = [
        f"layers.{name}"
        for name, module in model.layers.named_modules()
        if isinstance(module, Linear) and not name.endswith("router")
    ]
    if quantize_head:
        if model.config.tie_embeddings:
            raise LmforgeError(
                "the output head shares the embedding table (model.tie_embeddings): it cannot "
                "be quantized alone; drop --quantize-head"
            )
        names.append("output")
    return names


@torch.no_grad()
def quantize_model(
    model: Transformer,
    scheme: str,
    group_size: int | None = 128,
    method: str = "rtn",
    calibration: torch.Tensor | None = None,
    quantize_head: bool = False,
) -> tuple[list[str], int | None]:
    """Replace the model's Linears (see `quantized_names`) by QuantizedLinears; returns their
    names and the int4 group size used (see `fitting_group_size`). AWQ and GPTQ need
    `calibration` token ids (N, T)."""
    if method not in METHODS:
        raise LmforgeError(f"unknown quantization method {method!r}: use one of {METHODS}")
    names = quantized_names(model, quantize_head)
    inputs = [model.get_submodule(name).in_features for name in names]
    group_size = fitting_group_size(inputs, group_size) if scheme == "int4" else None
    for name in names:
        check_shape(tuple(model.get_submodule(name).weight.shape), scheme, group_size)
    if method != "rtn" and calibration is None:
        raise LmforgeError(f"--method {method} needs calibration data: pass --calibration")
    chosen: dict[str, QuantizedWeight] = {}
    if method == "awq":
        from lmforge.quant.awq import apply_awq

        apply_awq(model, calibration, scheme, group_size)
    elif method == "gptq":
        from lmforge.quant.gptq import gptq_quantize_model

        chosen = gptq_quantize_model(model, calibration, scheme, group_size)
    for name in names:
        linear = model.get_submodule(name)
        weight = chosen.get(name) or quantize(linear.weight.float(), scheme, group_size)
        replace_module(model, name, QuantizedLinear.from_weight(weight))
    return names, group_size


def fitting_group_size(inputs: list[int], requested: int | None) -> int | None:
    """The largest supported int4 group size up to `requested` that divides every matrix's
    input count: the speedrun's MLP (d_ff 704 = 11 · 64) takes groups of 64 when 128 is asked.
    Returns `requested` itself when none fits, so that the shape check names the matrix."""
    fitting = [g for g in GROUP_SIZES if g <= (requested or 0) and not any(n % g for n in inputs)]
    return max(fitting) if requested in GROUP_SIZES and fitting else requested


def quantized_skeleton(
    model: Transformer, scheme: str, group_size: int | None, names: list[str]
) -> None:
    """Give `model` empty QuantizedLinears at `names`, ready for a quantized state dict."""
    for name in names:
        linear = model.get_submodule(name)
        if not isinstance(linear, Linear):
            raise LmforgeError(f"{name} is not a Linear of this model: the checkpoint is damaged")
        module = QuantizedLinear(linear.in_features, linear.out_features, scheme, group_size)
        replace_module(model, name, module)


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)
