"""Distributed checkpoints: each rank writes its own shards with torch.distributed.checkpoint.

A distributed `step_N/` holds `dcp/` (DCP's `.metadata` plus one `.distcp` file per rank) in
place of `model.safetensors` + `optimizer.pt`, beside the usual `config.json`,
`trainer_state.pt`, `loader_state.json` and tokenizer. DCP stores every tensor with its global
shape and each shard's offsets, so a checkpoint saved at one layout loads at any other (fsdp=2
→ tp=2, or one process with no process group at all): the loading side asks for the shards it
owns and DCP reads them. The exception is ZeRO-1's optimizer state, which torch keeps per rank
(`optimizer_rank{r}.pt`): it resumes only at the same data-parallel degree.
`export_safetensors` turns a distributed checkpoint into the single `model.safetensors` that
inference reads.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from lmforge.errors import LmforgeError
from lmforge.model import Transformer
from lmforge.parallel.data_parallel import Zero1
from lmforge.train.checkpoint_dir import check_model_shape, is_distributed, read_model_config
from lmforge.weights_file import save_module

DCP_DIR = "dcp"


def save_distributed(
    final: Path,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    data_rank: int,
    write_metadata,
) -> None:
    """Every rank writes its shards of `final` (atomically, via a temporary folder); rank 0
    then calls `write_metadata(tmp)` for the small files and renames the folder into place."""
    main = dist.get_rank() == 0
    tmp = final.with_name(f".{final.name}.tmp")
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    state = {"model": get_model_state_dict(model)}
    if isinstance(optimizer, Zero1):
        torch.save(optimizer.optim.state_dict(), tmp / f"optimizer_rank{data_rank}.pt")
    else:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    dcp.save(state, checkpoint_id=tmp / DCP_DIR)
    if main:
        write_metadata(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    dist.barrier()


def load_distributed(
    checkpoint: Path,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    data_rank: int,
    data_parallel: int,
) -> None:
    """Load model and optimizer shards for this rank's layout (any layout, or none)."""
    check_model_shape(checkpoint, model.config)
    zero1_files = sorted(checkpoint.glob("optimizer_rank*.pt"))
    if zero1_files and (not isinstance(optimizer, Zero1) or len(zero1_files) != data_parallel):
        raise LmforgeError(
            f"checkpoint {checkpoint} holds ZeRO-1 optimizer state for {len(zero1_files)} "
            f"data-parallel ranks, which cannot be resharded to this layout ({data_parallel} "
            f"ranks{'' if isinstance(optimizer, Zero1) else ', no zero1'}): resume with "
            f"--parallel dp={len(zero1_files)} and train.parallel.zero1=true, or start over "
            "with --fresh"
        )
    if isinstance(optimizer, Zero1) and not zero1_files:
        raise LmforgeError(
            f"checkpoint {checkpoint} has no ZeRO-1 optimizer state: resume it with "
            "train.parallel.zero1=false, or start over with --fresh"
        )
    state = {"model": get_model_state_dict(model)}
    if not zero1_files:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    with warnings.catch_warnings():  # in one process DCP warns that it loads without a group
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=checkpoint / DCP_DIR)
    set_model_state_dict(model, state["model"])
    if zero1_files:
        path = checkpoint / f"optimizer_rank{data_rank}.pt"
        optimizer.optim.load_state_dict(torch.load(path, weights_only=True))
    else:
        set_optimizer_state_dict(model, optimizer, state["optim"])


def load_model_only(model: nn.Module, checkpoint: str | Path) -> None:
    """Load a distributed checkpoint's weights into a plain, whole model in this process."""
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # DCP warns that it loads without a process group: we ask it to
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=Path(checkpoint) / DCP_DIR, no_dist=True)
    model.load_state_dict(state["model"])


def export_safetensors(checkpoint: str | Path) -> Path:
    """Write `model.safetensors` (whole weights) into a distributed checkpoint; return its path."""
    checkpoint = Path(checkpoint)
    if not is_distributed(checkpoint):
        raise LmforgeError(f"{checkpoint} is not a distributed checkpoint (no {DCP_DIR}/.metadata)")
    model = Transformer(read_model_config(checkpoint))
    load_model_only(model, checkpoint)
    out = checkpoint / "model.safetensors"
    tmp = out.with_name(".model.safetensors.tmp")
    save_module(model, tmp)
    os.replace(tmp, out)
    return out
