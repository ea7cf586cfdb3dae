"""A checkpoint folder on disk, without torch: finding the newest, reading its JSON.

`checkpoints/step_N/` folders (see train/checkpoint.py for what they hold). Everything here
reads names and JSON only, so a command given a wrong path, a Hugging Face folder or a damaged
config says so in one line before it imports torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.model.config import ModelConfig

STEP_PREFIX = "step_"


def list_checkpoints(checkpoints_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    checkpoints_dir = Path(checkpoints_dir)
    if not checkpoints_dir.is_dir():
        return []
    found = [
        p
        for p in checkpoints_dir.iterdir()
        if p.is_dir() and p.name.startswith(STEP_PREFIX) and has_weights(p)
    ]
    return sorted(found, key=lambda p: int(p.name[len(STEP_PREFIX) :]))


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint at `path`: a checkpoint, a `checkpoints/` folder or a run (its newest)."""
    path = Path(path)
    if not path.exists():
        raise LmforgeError(
            f"no checkpoint found at {path} (no such file or folder): pass a run folder or a "
            "checkpoints/step_N folder"
        )
    refuse_hf_folder(path)
    if has_weights(path):
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
    refuse_hf_folder(Path(checkpoint))
    try:
        config = ModelConfig(**json.loads(path.read_text())["model"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise LmforgeError(
            f"{path} is missing or not an lmforge checkpoint config ({type(e).__name__}: {e}): "
            "pass a checkpoint that lmforge wrote"
        ) from None
    try:
        config.validate()
    except LmforgeError as e:
        raise LmforgeError(f"{path} holds an invalid model shape: {e}") from None
    return config


def refuse_hf_folder(path: Path) -> None:
    """A Hugging Face model folder (config.json with model_type, no lmforge 'model' key)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return
    if (
        isinstance(config, dict)
        and "model" not in config
        and ("model_type" in config or "architectures" in config)
    ):
        raise LmforgeError(
            f"{path} is a Hugging Face model folder: run `lmforge import --from {path} --out "
            "CKPT` first, then pass CKPT"
        )


def is_distributed(checkpoint: str | Path) -> bool:
    """Whether `checkpoint` holds per-rank shards (lmforge.train.checkpoint_dcp)."""
    return (Path(checkpoint) / "dcp" / ".metadata").is_file()


def has_weights(checkpoint: Path) -> bool:
    return (checkpoint / "model.safetensors").is_file() or is_distributed(checkpoint)


TRAINED_ON = "trained_on"
"""The run config's key for the data a run trained on: {"shards": folder, "documents": path,
"stdlib", or None when the run was given prepared shards}, absolute paths."""


def data_record(shard_dir: str | Path, documents: str | None) -> dict:
    """What `TRAINED_ON` holds for a run on `shard_dir`, prepared from `documents` (a path,
    "stdlib" or "hf:NAME"; None when the shards were given ready-made)."""
    if documents and documents != "stdlib" and not documents.startswith("hf:"):
        documents = str(Path(documents).resolve())
    return {"shards": str(Path(shard_dir).resolve()), "documents": documents}


def read_run_config(checkpoint: str | Path) -> dict:
    """The run config saved with `checkpoint` ({} for one written without, e.g. imported)."""
    path = Path(checkpoint) / "config.json"
    try:
        run = json.loads(path.read_text()).get("run")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return {}
    return run if isinstance(run, dict) else {}


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


def check_checkpoint(path: str | Path) -> None:
    """Refuse a wrong checkpoint path (missing, a Hugging Face folder, no lmforge config) in one
    line before torch is imported."""
    read_model_config(resolve_checkpoint(path))
