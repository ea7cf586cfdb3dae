"""The optimizer a run uses: AdamW for every parameter (`train/adamw.py`), or Muon for the
blocks' matrices with AdamW for the rest (`train/muon.py`), from `train.optimizer.name`."""

from __future__ import annotations

import torch
from torch import nn

from lmforge.parallel.world import World
from lmforge.train.adamw import adamw_choice, param_groups
from lmforge.train.config import OPTIMIZERS, TrainConfig
from lmforge.train.muon import Muon, muon_param_groups


def optimizer_choice(
    model: nn.Module,
    device: torch.device,
    lr: float,
    weight_decay: float,
    fused: bool = True,
    optimizer: str = "adamw",
    muon_lr: float = 0.02,
    muon_momentum: float = 0.95,
    embed_lr: float = 0.0,
) -> tuple[type, list[dict], dict]:
    """The optimizer class for `optimizer` ("adamw": as `adamw_choice` picks it; "muon": Muon
    for the blocks' matrices, lmforge's AdamW for the rest), its parameter groups over `model`
    (the input embedding at `embed_lr` where set) and its extra keyword arguments."""
    if optimizer == "muon":
        groups = muon_param_groups(model, weight_decay, lr, muon_lr, embed_lr)
        return Muon, groups, {"momentum": muon_momentum}
    if optimizer != "adamw":
        raise ValueError(f"unknown optimizer {optimizer!r}: choose one of {OPTIMIZERS}")
    cls, extra = adamw_choice(device, fused)
    return cls, param_groups(model, weight_decay, lr, embed_lr), extra


def build_optimizer(
    model: nn.Module,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    fused: bool = True,
    optimizer: str = "adamw",
    muon_lr: float = 0.02,
    muon_momentum: float = 0.95,
    embed_lr: float = 0.0,
) -> torch.optim.Optimizer:
    """The optimizer `optimizer_choice` picks over `model`'s parameters (plain or DTensor
    shards). A group's `lr_scale`, where it has one, is what the schedule's learning rate is
    multiplied by for it (`train/step.py`)."""
    device = next(model.parameters()).device
    cls, groups, extra = optimizer_choice(
        model, device, lr, weight_decay, fused, optimizer, muon_lr, muon_momentum, embed_lr
    )
    return cls(groups, lr=lr, betas=betas, **extra)


def optimizer_from_config(
    model: nn.Module, cfg: TrainConfig, world: World
) -> torch.optim.Optimizer:
    """The optimizer `cfg` names (train.optimizer.name, lr, betas, weight_decay, muon_*, embed_lr)
    over `model`'s parameters, plain or sharded over `world`; itself sharded over the dp ranks
    by ZeRO-1 (`train.parallel.zero1`) when there are several."""
    betas = (cfg.optimizer.beta1, cfg.optimizer.beta2)
    choice = (
        cfg.optimizer.fused_adamw,
        cfg.optimizer.name,
        cfg.optimizer.muon_lr,
        cfg.optimizer.muon_momentum,
        cfg.optimizer.embed_lr,
    )
    if cfg.parallel.zero1 and world.layout.dp > 1:
        from lmforge.parallel.data_parallel import build_zero1

        device = next(model.parameters()).device
        cls, groups, extra = optimizer_choice(
            model, device, cfg.optimizer.lr, cfg.optimizer.weight_decay, *choice
        )
        return build_zero1(groups, world.mesh["dp"], cls, lr=cfg.optimizer.lr, betas=betas, **extra)
    return build_optimizer(model, cfg.optimizer.lr, betas, cfg.optimizer.weight_decay, *choice)
