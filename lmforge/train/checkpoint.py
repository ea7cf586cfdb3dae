"""Checkpoints: `checkpoints/step_N/` folders that resume a run exactly and load without pickle.

A folder holds `model.safetensors`, `config.json` (the model shape and the run config),
`optimizer.pt` and `trainer_state.pt` (tensors and plain data, read with weights_only=True;
batches depend only on (seed, step), so the torch RNG is the only generator state kept),
`loader_state.json` and a copy of the tokenizer, so a checkpoint is all that inference needs.
It is written under a temporary name and renamed, so an interrupted save never leaves a half
checkpoint where a complete one is expected. A run on many processes writes a distributed
checkpoint instead, with the weights and optimizer state as per-rank shards in `dcp/`
(lmforge.parallel.checkpoint); it resumes at any layout and loads for inference like any other.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_model, save_model

from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig, Transformer

if TYPE_CHECKING:
    from lmforge.parallel.world import World

STEP_PREFIX = "step_"


def save_checkpoint(
    checkpoints_dir: str | Path,
    step: int,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict,
    loader_state: dict,
    run_config: dict,
    tokenizer_dir: str | Path | None = None,
    keep_last: int = 2,
    world: World | None = None,
) -> Path:
    """Write `step_{step}/` atomically and keep only the newest `keep_last` checkpoints.

    With a `world`, every rank must call this: each writes its shards, rank 0 the rest.
    """
    checkpoints_dir = Path(checkpoints_dir)
    final = checkpoints_dir / f"{STEP_PREFIX}{step}"

    def write_metadata(tmp: Path) -> None:
        config = {"model": asdict(model.config), "run": run_config}
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        torch.save({**trainer_state, "step": step, "rng": _rng_state()}, tmp / "trainer_state.pt")
        (tmp / "loader_state.json").write_text(json.dumps(loader_state) + "\n")
        if tokenizer_dir is not None:
            shutil.copytree(tokenizer_dir, tmp / "tokenizer")

    if world is not None:
        from lmforge.parallel.checkpoint import save_distributed

        save_distributed(final, model, optimizer, world.data_rank, write_metadata)
        if not world.is_main:
            return final
    else:
        tmp = checkpoints_dir / f".{STEP_PREFIX}{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_model(model, str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        write_metadata(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    for old in list_checkpoints(checkpoints_dir)[:-keep_last]:
        shutil.rmtree(old)
    return final


def list_checkpoints(checkpoints_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    checkpoints_dir = Path(checkpoints_dir)
    if not checkpoints_dir.is_dir():
        return []
    found = [
        p
        for p in checkpoints_dir.iterdir()
        if p.is_dir() and p.name.startswith(STEP_PREFIX) and _has_weights(p)
    ]
    return sorted(found, key=lambda p: int(p.name[len(STEP_PREFIX) :]))


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint at `path`: a checkpoint, a `checkpoints/` folder or a run (its newest)."""
    path = Path(path)
    if _has_weights(path):
        return path
    for candidate in (path / "checkpoints", path):
        found = list_checkpoints(candidate)
        if found:
            return found[-1]
    raise LmforgeError(
        f"no checkpoint found at {path}: pass a run folder or a checkpoints/step_N folder"
    )


def read_model_config(checkpoint: str | Path) -> ModelConfig:
    path = Path(checkpoint) / "config.json"
    try:
        return ModelConfig(**json.loads(path.read_text())["model"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise LmforgeError(f"{path} is missing or not an lmforge checkpoint config: {e}") from e


def load_model_weights(model: Transformer, checkpoint: str | Path) -> None:
    """Load weights into `model`, refusing a checkpoint of another shape with a clear message."""
    check_model_shape(checkpoint, model.config)
    weights = Path(checkpoint) / "model.safetensors"
    if weights.is_file():
        load_model(model, str(weights))
    else:  # a distributed checkpoint: gather its shards into this whole model
        from lmforge.parallel.checkpoint import load_model_only

        load_model_only(model, checkpoint)


_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def saved_dtype(path: str | Path) -> torch.dtype:
    """The dtype the checkpoint at `path` stores its weights in (float32 for distributed ones)."""
    from safetensors import safe_open

    weights = resolve_checkpoint(path) / "model.safetensors"
    if not weights.is_file():
        return torch.float32
    with safe_open(str(weights), framework="pt") as f:
        name = next(iter(f.keys()), None)
        code = "F32" if name is None else f.get_slice(name).get_dtype()
    return _SAFETENSORS_DTYPES.get(code, torch.float32)


def check_model_shape(checkpoint: str | Path, config: ModelConfig) -> None:
    saved = read_model_config(checkpoint)
    if saved != config:
        diff = {
            k: (v, getattr(config, k)) for k, v in asdict(saved).items() if getattr(config, k) != v
        }
        raise LmforgeError(
            f"checkpoint {checkpoint} has another model shape "
            f"({', '.join(f'{k}: saved {a} vs now {b}' for k, (a, b) in diff.items())}): "
            "use the same preset/config as the run that wrote it, or start over with --fresh"
        )


def is_distributed(checkpoint: str | Path) -> bool:
    """Whether `checkpoint` holds per-rank shards (lmforge.parallel.checkpoint)."""
    return (Path(checkpoint) / "dcp" / ".metadata").is_file()


def _has_weights(checkpoint: Path) -> bool:
    return (checkpoint / "model.safetensors").is_file() or is_distributed(checkpoint)


def load_training_state(
    checkpoint: str | Path, optimizer: torch.optim.Optimizer | None
) -> tuple[dict, dict]:
    """Restore the optimizer (unless `optimizer` is None: a distributed checkpoint restores it
    with its shards) and RNGs; return (trainer_state, loader_state)."""
    checkpoint = Path(checkpoint)
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=True))
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    _set_rng_state(state.pop("rng"))
    loader_state = json.loads((checkpoint / "loader_state.json").read_text())
    return state, loader_state


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu"):
    """`(model, tokenizer)` from a checkpoint, checkpoints or run folder; the model in eval mode."""
    from lmforge.tokenizer import Tokenizer

    checkpoint = resolve_checkpoint(path)
    model = Transformer(read_model_config(checkpoint))
    load_model_weights(model, checkpoint)
    return model.to(device).eval(), Tokenizer.load(checkpoint / "tokenizer")
