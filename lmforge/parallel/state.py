"""Whole tensors from a parallelized module: the gathered state dict a library user saves.

FSDP2 and tensor parallelism leave each rank with DTensor shards, and DDP prefixes every name
with `module.`; `full_state_dict` undoes both, so the result loads into the plain module.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s whole parameters and buffers on every rank, on the CPU, under the plain
    module's names. A collective under a process group: every rank must call it."""
    if not dist.is_initialized():
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
