"""Checkpoints: `checkpoints/step_N/` folders that resume a run exactly and load without pickle.

A folder holds `model.safetensors`, `config.json` (the model shape and the run config),
`optimizer.pt` and `trainer_state.pt` (tensors and plain data, read with weights_only=True;
batches depend only on (seed, step), so the torch RNG is the only generator state kept),
`loader_state.json` and a copy of the tokenizer, so a checkpoint is all that inference needs.
`config.json`'s run config also records, under `trained_on`, the token shards and documents the
run trained on, so `lmforge eval` defaults to the run's own validation split.
It is written under a temporary name and renamed, so an interrupted save never leaves a half
checkpoint where a complete one is expected; a save that fails (a full disk) removes its
temporary folder. A run on many processes writes a distributed checkpoint instead, with the
weights and optimizer state as per-rank shards in `dcp/` (lmforge.train.checkpoint_dcp); it
resumes at any layout and loads for inference like any other.

`load_checkpoint` is the one way a command (generate, chat, serve, eval, export, speedrun) loads
a model: it checks the device, then the folder (missing, a Hugging Face folder, a config of
another shape, damaged or truncated weights) and says each problem and its fix in one line.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model

from lmforge.errors import LmforgeError
from lmforge.model import Transformer
from lmforge.model.lora import LoraSpec, apply_lora, lora_spec_of, merge_lora
from lmforge.train.checkpoint_dir import (
    STEP_PREFIX,
    check_model_shape,
    list_checkpoints,
    read_model_config,
    resolve_checkpoint,
)
from lmforge.weights_file import save_module

if TYPE_CHECKING:
    from lmforge.parallel.world import World


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
) -> Path:
    """Write `step_{step}/` atomically and keep only the newest `keep_last` checkpoints."""
    checkpoints_dir = Path(checkpoints_dir)
    final = checkpoints_dir / f"{STEP_PREFIX}{step}"
    tmp = checkpoints_dir / f".{STEP_PREFIX}{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_module(model, tmp / "model.safetensors")
        _torch_save(optimizer.state_dict(), tmp / "optimizer.pt")
        _write_metadata(tmp, step, model, trainer_state, loader_state, run_config, tokenizer_dir)
    except BaseException:  # a full disk, Ctrl-C: the half-written folder goes, its space too
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _keep_newest(checkpoints_dir, keep_last)
    return final


def save_sharded_checkpoint(
    world: World,
    checkpoints_dir: str | Path,
    step: int,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict,
    loader_state: dict,
    run_config: dict,
    tokenizer_dir: str | Path | None = None,
    keep_last: int = 2,
) -> Path:
    """`save_checkpoint` for a run on many processes: every rank must call it; each writes its
    shards (lmforge.train.checkpoint_dcp), rank 0 the rest."""
    from lmforge.train.checkpoint_dcp import save_distributed

    checkpoints_dir = Path(checkpoints_dir)
    final = checkpoints_dir / f"{STEP_PREFIX}{step}"

    def write_metadata(tmp: Path) -> None:
        _write_metadata(tmp, step, model, trainer_state, loader_state, run_config, tokenizer_dir)

    save_distributed(final, model, optimizer, world.data_rank, write_metadata)
    if world.is_main:
        _keep_newest(checkpoints_dir, keep_last)
    return final


def _write_metadata(
    tmp: Path,
    step: int,
    model: Transformer,
    trainer_state: dict,
    loader_state: dict,
    run_config: dict,
    tokenizer_dir: str | Path | None,
) -> None:
    """Everything in a checkpoint but the weights and the optimizer state."""
    config = {"model": asdict(model.config), "run": run_config}
    spec = lora_spec_of(model)
    if spec is not None:  # the adapters are in model.safetensors beside the frozen weights
        config["lora"] = spec.to_dict()
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _torch_save({**trainer_state, "step": step, "rng": _rng_state()}, tmp / "trainer_state.pt")
    (tmp / "loader_state.json").write_text(json.dumps(loader_state) + "\n")
    if tokenizer_dir is not None:
        shutil.copytree(tokenizer_dir, tmp / "tokenizer")


def _torch_save(obj: object, path: Path) -> None:
    """`torch.save` through a Python file: given a path, torch's own writer reports a full disk
    as "unexpected pos"; through a file, the OSError (ENOSPC) comes with it."""
    with open(path, "wb") as f:
        torch.save(obj, f)


def _keep_newest(checkpoints_dir: Path, keep_last: int) -> None:
    """Remove all but the newest `keep_last` checkpoints, each renamed out of sight first: a
    process killed mid-way leaves a hidden `.step_N.old`, never a half-removed `step_N`; the
    next save removes it."""
    for trash in checkpoints_dir.glob(f".{STEP_PREFIX}*.old"):  # a killed removal's
        shutil.rmtree(trash, ignore_errors=True)
    for old in list_checkpoints(checkpoints_dir)[:-keep_last]:
        trash = old.with_name(f".{old.name}.old")
        os.replace(old, trash)
        shutil.rmtree(trash)


def load_model_weights(model: Transformer, checkpoint: str | Path) -> None:
    """Load weights into `model`, refusing a checkpoint of another shape with a clear message."""
    check_model_shape(checkpoint, model.config)
    weights = Path(checkpoint) / "model.safetensors"
    if not weights.is_file():  # a distributed checkpoint: gather its shards into this whole model
        from lmforge.train.checkpoint_dcp import load_model_only

        load_model_only(model, checkpoint)
        return
    try:
        load_model(model, str(weights))
    except (SafetensorError, OSError) as e:
        raise LmforgeError(
            f"{weights} is damaged or truncated ({e}): export it again, or pass another "
            "checkpoint (an earlier checkpoints/step_N)"
        ) from None
    except RuntimeError as e:  # tensors missing, extra or of other shapes than config.json says
        detail = " ".join(str(e).split())
        raise LmforgeError(
            f"{weights} does not match the model shape in {weights.parent / 'config.json'} "
            f"({detail[:300]}): pass a checkpoint whose files were written together"
        ) from None


_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_lora(checkpoint: str | Path) -> LoraSpec | None:
    """The LoRA settings a checkpoint's weights were trained with, if any."""
    config = json.loads((resolve_checkpoint(checkpoint) / "config.json").read_text())
    return LoraSpec(**config["lora"]) if config.get("lora") else None


def saved_dtype(path: str | Path) -> torch.dtype:
    """The dtype the checkpoint at `path` stores its weights in (float32 for distributed ones)."""
    from safetensors import safe_open

    weights = resolve_checkpoint(path) / "model.safetensors"
    if not weights.is_file():
        return torch.float32
    try:
        with safe_open(str(weights), framework="pt") as f:
            name = next(iter(f.keys()), None)
            code = "F32" if name is None else f.get_slice(name).get_dtype()
    except (SafetensorError, OSError) as e:
        raise LmforgeError(
            f"{weights} is damaged or truncated ({e}): export it again, or pass another "
            "checkpoint (an earlier checkpoints/step_N)"
        ) from None
    return _SAFETENSORS_DTYPES.get(code, torch.float32)


def load_training_state(
    checkpoint: str | Path, optimizer: torch.optim.Optimizer | None
) -> tuple[dict, dict]:
    """Restore the optimizer (unless `optimizer` is None: a distributed checkpoint restores it
    with its shards) and RNGs; return (trainer_state, loader_state)."""
    checkpoint = Path(checkpoint)
    if optimizer is not None:
        saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)
        try:
            optimizer.load_state_dict(saved)
        except (
            ValueError
        ) as e:  # another grouping: train.optimizer.name or train.optimizer.embed_lr changed
            raise LmforgeError(
                f"optimizer state in {checkpoint} does not fit this run's optimizer ({e}): "
                "resume with the train.optimizer.name and train.optimizer.embed_lr it was trained "
                "with, or start over with --fresh"
            ) from None
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


def load_checkpoint(
    path: str | Path, device: str | torch.device = "cpu", adapter: str | Path | None = None
):
    """`(model, tokenizer)` from a checkpoint, checkpoints or run folder; the model in eval mode
    on `device` (cpu, cuda, cuda:N, mps or auto). A LoRA run's checkpoint comes with its
    adapters merged; `adapter`, a PEFT LoRA folder, is merged on top. Every problem is a
    one-line LmforgeError."""
    from lmforge.device.choice import pick_device
    from lmforge.tokenizer import Tokenizer

    device = pick_device(device)
    checkpoint = resolve_checkpoint(path)
    model = Transformer(read_model_config(checkpoint))
    lora = read_lora(checkpoint)
    if lora is not None:
        apply_lora(model, lora)
    load_model_weights(model, checkpoint)
    merge_lora(model)
    if adapter is not None:
        from lmforge.model.peft import load_adapter

        load_adapter(model, adapter)
        merge_lora(model)
    tokenizer = Tokenizer.load(checkpoint / "tokenizer")
    if tokenizer.vocab_size > model.config.vocab_size:
        raise LmforgeError(
            f"the tokenizer in {checkpoint} has {tokenizer.vocab_size} ids but the model only "
            f"{model.config.vocab_size} embeddings: pass a checkpoint whose files were written "
            "together"
        )
    return model.to(device).eval(), tokenizer
