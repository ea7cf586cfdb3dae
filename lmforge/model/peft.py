"""LoRA adapters as PEFT folders: `adapter_config.json` and `adapter_model.safetensors`.

The tensors carry PEFT's names on the Hugging Face Llama layout that `lmforge export` writes
(`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`), so
`peft.PeftModel.from_pretrained(exported_model, folder)` loads an lmforge adapter, and a PEFT
adapter trained on an exported model loads onto the lmforge checkpoint. Only what lmforge's
LoRA computes is accepted on the way in (plain LoRA on the projections, no bias, no DoRA, one
rank and alpha for every module); anything else is refused in one line, never half-applied.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.model.hf import _hf_name, _lmforge_name, _write_folder, _write_json
from lmforge.model.lora import TARGETS, LoraSpec, apply_lora, lora_modules, lora_spec_of
from lmforge.weights_file import save_tensors

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
_PARTS = ("lora_A", "lora_B")

# adapter_config.json settings lmforge's LoRA does not compute, and the value that means "off".
_UNSUPPORTED = {
    "use_dora": False,
    "fan_in_fan_out": False,
    "modules_to_save": None,
    "layers_to_transform": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "bias": "none",
}


def peft_key(name: str) -> str:
    """PEFT's name for an adapter tensor: `layers.0.attn.q_proj.lora_A` →
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`."""
    module, part = name.rsplit(".", 1)
    return f"{PREFIX}{_hf_name(module + '.weight').removesuffix('.weight')}.{part}.weight"


def lmforge_key(key: str) -> str | None:
    """The inverse of `peft_key`; None for a name that is no LoRA tensor of a Llama projection."""
    if not key.startswith(PREFIX):
        return None
    for part in _PARTS:
        suffix = f".{part}.weight"
        if key.endswith(suffix):
            module = _lmforge_name(key[len(PREFIX) : -len(suffix)] + ".weight")
            return None if module is None else f"{module.removesuffix('.weight')}.{part}"
    return None


def adapter_config(spec: LoraSpec, base_model: str | None = None) -> dict:
    """The adapter_config.json PEFT writes for a LoraConfig of these settings."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.r,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": sorted(TARGETS[t].split(".")[1] for t in spec.targets),
        "use_rslora": spec.rslora,
        "init_lora_weights": True,
        "inference_mode": True,
        "layers_pattern": None,
        "revision": None,
        **_UNSUPPORTED,
    }


def save_adapter(model: nn.Module, folder: str | Path, base_model: str | None = None) -> Path:
    """Write `model`'s adapters to `folder` in PEFT's format, atomically (a temporary folder
    renamed into place)."""
    spec = lora_spec_of(model)
    if spec is None:
        raise LmforgeError("the model has no LoRA adapters to save: train with --lora")
    tensors = {
        peft_key(f"{name}.{part}"): getattr(module, part).detach().float().contiguous()
        for name, module in lora_modules(model)
        for part in _PARTS
    }

    def write(tmp: Path) -> None:
        save_tensors(tensors, tmp / ADAPTER_WEIGHTS, metadata={"format": "pt"})
        _write_json(tmp / ADAPTER_CONFIG, adapter_config(spec, base_model))

    folder = Path(folder)
    if folder.is_dir() and (folder / ADAPTER_CONFIG).is_file():
        shutil.rmtree(folder)  # an earlier save of this run's adapter: replaced
    return _write_folder(folder, write)


def read_adapter_spec(folder: str | Path) -> LoraSpec:
    """The LoraSpec of a PEFT adapter folder, refusing settings lmforge does not compute."""
    path = Path(folder) / ADAPTER_CONFIG
    if not path.is_file():
        raise LmforgeError(
            f"{folder} has no {ADAPTER_CONFIG}: pass a LoRA adapter folder (PEFT's "
            "save_pretrained, or the adapter/ of an lmforge --lora run)"
        )
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise LmforgeError(f"{path} is not valid JSON ({e}): save the adapter again") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise LmforgeError(f"{path} is a {config['peft_type']} adapter; lmforge loads LoRA only")
    for key, off in _UNSUPPORTED.items():
        value = config.get(key, off)
        if value != off and not (off in ({}, None) and not value):
            raise LmforgeError(
                f"{path} sets {key}={value!r}, which lmforge's LoRA does not compute: "
                f"train the adapter with {key}={off!r}"
            )
    targets = config.get("target_modules")
    if targets == "all-linear":
        targets = list(TARGETS)
    elif isinstance(targets, str) or not targets:
        raise LmforgeError(
            f"{path} gives target_modules as {targets!r}; lmforge loads a list of projection "
            f"names ({', '.join(TARGETS[t].split('.')[1] for t in TARGETS)})"
        )
    return LoraSpec(
        r=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        dropout=float(config.get("lora_dropout", 0.0)),
        targets=tuple(targets),
        rslora=bool(config.get("use_rslora", False)),
    )


def load_adapter(model: nn.Module, folder: str | Path) -> LoraSpec:
    """Put the PEFT adapter in `folder` onto `model` (a Transformer without adapters): LoRA is
    applied with the adapter's settings and every adapter tensor loaded, or nothing changes."""
    spec = read_adapter_spec(folder)
    weights = Path(folder) / ADAPTER_WEIGHTS
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as e:
        raise LmforgeError(f"{weights} cannot be read ({e}): save the adapter again") from None
    ours = {}
    for key, tensor in tensors.items():
        name = lmforge_key(key)
        if name is None:
            raise LmforgeError(
                f"{weights} holds {key!r}, which is no LoRA tensor of a Llama projection: "
                "lmforge loads adapters on q/k/v/o/gate/up/down projections only"
            )
        ours[name] = tensor
    with torch.device("meta"):  # the expected names and shapes, without touching `model`
        probe = apply_lora(_shape_copy(model), spec)
    expected = {f"{n}.{p}": getattr(m, p).shape for n, m in lora_modules(probe) for p in _PARTS}
    missing = sorted(set(expected) - set(ours))
    if missing:
        raise LmforgeError(
            f"{weights} lacks {len(missing)} adapter tensors its config targets (first: "
            f"{peft_key(missing[0])}): the adapter was made for another model"
        )
    for name, tensor in ours.items():
        if name not in expected or tensor.shape != expected[name]:
            got = tuple(tensor.shape)
            raise LmforgeError(
                f"{weights}: {peft_key(name)} has shape {got}, not "
                f"{tuple(expected.get(name, ()))}: the adapter was made for another model shape"
            )
    apply_lora(model, spec)
    modules = dict(lora_modules(model))
    with torch.no_grad():
        for name, tensor in ours.items():
            module, part = name.rsplit(".", 1)
            getattr(modules[module], part).copy_(tensor)
    return spec


def _shape_copy(model: nn.Module) -> nn.Module:
    from lmforge.model.transformer import Transformer

    return Transformer(model.config)
