"""Calibration passes for AWQ and GPTQ: run a model block by block over calibration ids and hand
each Linear's input activations to a callback.

Both methods need the same thing: the inputs each block's Linears see on calibration data, one
block at a time, so that memory holds one block's activations, not the whole model's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.model.layers import Linear, SwiGLU
from lmforge.model.transformer import Block, Transformer
from lmforge.quant.schemes import check_shape


def check_inputs(
    model: Transformer, calibration: torch.Tensor, scheme: str, group_size: int | None
) -> None:
    """Refuse, before anything changes, a scheme no block Linear can take or bad calibration."""
    for block in model.layers:
        for linear in block_linears(block).values():
            check_shape(tuple(linear.weight.shape), scheme, group_size)
    check_calibration(model, calibration)


def check_calibration(model: Transformer, calibration: torch.Tensor) -> None:
    """Refuse calibration ids that are not a (N, T) integer tensor the model can run."""
    if calibration.dim() != 2 or calibration.dtype not in (torch.int32, torch.int64):
        raise LmforgeError(
            f"calibration ids must be an integer tensor (N, T), got {calibration.dtype} "
            f"{tuple(calibration.shape)}: pass tokenized sequences"
        )
    if calibration.shape[1] > model.config.max_seq_len:
        raise LmforgeError(
            f"calibration sequences of {calibration.shape[1]} tokens exceed model.max_seq_len="
            f"{model.config.max_seq_len}: pass shorter sequences"
        )


def block_linears(block: Block) -> dict[str, Linear]:
    """The Linears AWQ and GPTQ handle in one block, by name relative to the block.

    A mixture-of-experts MLP is left out: its experts stay round-to-nearest."""
    names = {f"attn.{n}": getattr(block.attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    if isinstance(block.mlp, SwiGLU):
        for n in ("gate_proj", "up_proj", "down_proj"):
            names[f"mlp.{n}"] = getattr(block.mlp, n)
    return names


@torch.no_grad()
def block_passes(
    model: Transformer, calibration: torch.Tensor, batch: int = 8
) -> Iterator[tuple[int, Block, Callable[..., torch.Tensor]]]:
    """Yield (index, block, run) for each block in order.

    run(on_input=None) runs the block over the current hidden states of every calibration row,
    calling on_input(name, x (tokens, in_features)) for each Linear of block_linears, and makes
    its outputs the next block's inputs. Call it once per block, after changing the block's
    weights as the method wants the next block to see them; a second call with on_input
    recomputes from the same inputs. Memory: two (N, T, d_model) hidden-state tensors.
    """
    check_calibration(model, calibration)
    device = next(model.parameters()).device
    ids = calibration.to(device)
    h = model.tok_embeddings(ids)
    cos, sin = model.rope(0, ids.shape[1])
    for i, block in enumerate(model.layers):
        state = {"inputs": h, "outputs": None}

        def run(
            on_input: Callable[[str, torch.Tensor], None] | None = None,
            _block: Block = block,
            _state: dict = state,
        ) -> torch.Tensor:
            hooks = []
            if on_input is not None:
                for name, linear in block_linears(_block).items():
                    hooks.append(linear.register_forward_pre_hook(_hook(name, on_input)))
            x = _state["inputs"]
            try:
                with torch.no_grad():
                    out = torch.cat(
                        [_block(x[j : j + batch], cos, sin) for j in range(0, len(x), batch)]
                    )
            finally:
                for hook in hooks:
                    hook.remove()
            _state["outputs"] = out
            return out

        yield i, block, run
        if state["outputs"] is None:
            run()
        h = state["outputs"]


def _hook(name: str, on_input: Callable[[str, torch.Tensor], None]) -> Callable:
    def hook(module: nn.Module, args: tuple) -> None:
        x = args[0]
        on_input(name, x.reshape(-1, x.shape[-1]).float())

    return hook
