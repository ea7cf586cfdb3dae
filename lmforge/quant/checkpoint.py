"""Quantized checkpoints: a checkpoint folder whose model.safetensors holds integer codes,
scales and zero points, and whose config.json says how under `quantization`.

{"scheme": "int8" | "int4", "group_size": 128 | null, "method": "rtn" | "awq" | "gptq",
 "quantize_head": bool, "modules": ["layers.0.attn.q_proj", ...]}

The model shape, the run config and the tokenizer are copied from the source checkpoint, so
every command that reads a checkpoint's metadata reads this one the same way. Loading builds the
model, swaps in empty QuantizedLinears at the listed modules and loads the file strictly, so a
file whose tensors disagree with its config is refused with the tensor named.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from lmforge.errors import LmforgeError
from lmforge.model.transformer import Transformer
from lmforge.quant.quantize import quantize_model, quantized_skeleton
from lmforge.quant.schemes import SCHEMES
from lmforge.train.checkpoint import load_checkpoint
from lmforge.train.checkpoint_dir import read_model_config, resolve_checkpoint
from lmforge.weights_file import save_module

QUANTIZATION = "quantization"


def read_quantization(checkpoint: str | Path) -> dict | None:
    """The checkpoint's `quantization` block, or None for a float checkpoint."""
    path = resolve_checkpoint(checkpoint) / "config.json"
    try:
        block = json.loads(path.read_text()).get(QUANTIZATION)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None  # not a readable checkpoint: the float loader says what is wrong
    if block is not None and block.get("scheme") not in SCHEMES:
        raise LmforgeError(
            f"{checkpoint}: quantization scheme {block.get('scheme')!r} is not one of {SCHEMES}: "
            "quantize the checkpoint again with this version of lmforge"
        )
    return block


def quantize_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    scheme: str,
    group_size: int | None = 128,
    method: str = "rtn",
    calibration: torch.Tensor | None = None,
    quantize_head: bool = False,
) -> Path:
    """Write a quantized copy of `checkpoint` to the folder `out` (atomically); returns it."""
    source = resolve_checkpoint(checkpoint)
    if read_quantization(source) is not None:
        raise LmforgeError(f"{source} is already quantized: quantize its float checkpoint")
    model, _ = load_checkpoint(source)
    model = model.float()
    names, group_size = quantize_model(
        model, scheme, group_size, method, calibration, quantize_head
    )
    config = json.loads((source / "config.json").read_text())
    config.pop("lora", None)  # load_checkpoint merged the adapters
    config[QUANTIZATION] = {
        "scheme": scheme,
        "group_size": group_size,
        "method": method,
        "quantize_head": quantize_head,
        "modules": names,
    }
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_module(model, tmp / "model.safetensors")
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copytree(source / "tokenizer", tmp / "tokenizer")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def load_quantized(checkpoint: str | Path, device: str | torch.device = "cpu"):
    """`(model, tokenizer)` of a quantized checkpoint, the model in eval mode on `device`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    from lmforge.device.choice import pick_device
    from lmforge.tokenizer import Tokenizer

    found = resolve_checkpoint(checkpoint)
    block = read_quantization(found)
    if block is None:
        raise LmforgeError(f"{found} is not a quantized checkpoint: load it with load_checkpoint")
    model = Transformer(read_model_config(found))
    quantized_skeleton(model, block["scheme"], block.get("group_size"), block["modules"])
    weights = found / "model.safetensors"
    try:
        load_model(model, str(weights))
    except (SafetensorError, OSError) as e:
        raise LmforgeError(f"{weights} is damaged or truncated ({e}): quantize again") from None
    except RuntimeError as e:  # missing or extra tensors, or shapes other than the config's
        detail = " ".join(str(e).split())[:300]
        raise LmforgeError(
            f"{weights} does not match its {block['scheme']} config.json ({detail}): "
            "quantize the checkpoint again"
        ) from None
    check_dtypes(model, block["scheme"], weights)
    tokenizer = Tokenizer.load(found / "tokenizer")
    return model.to(pick_device(device)).eval(), tokenizer


def check_dtypes(model: Transformer, scheme: str, weights: Path) -> None:
    """safetensors copies values across dtypes; refuse codes stored under another scheme."""
    from safetensors import safe_open

    expected = "I8" if scheme == "int8" else "U8"
    with safe_open(str(weights), "pt") as f:
        for key in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
            if key.endswith(".qweight"):
                found = f.get_slice(key).get_dtype()
                if found != expected:
                    raise LmforgeError(
                        f"{weights}: {key} holds {found} codes but config.json says {scheme} "
                        f"({expected}): quantize the checkpoint again"
                    )


def load_any_checkpoint(checkpoint: str | Path, device: str | torch.device = "cpu"):
    """`(model, tokenizer)` of a float or a quantized checkpoint, as it was saved."""
    if read_quantization(checkpoint) is not None:
        return load_quantized(checkpoint, device)
    return load_checkpoint(checkpoint, device)
