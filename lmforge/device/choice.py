"""Device choice in one place: every command that runs a model (train, generate, chat, serve,
eval, export) names its device through `pick_device`, which checks the name and that this
machine has the device, and says what to pass instead in one line when it does not.

`auto` (or no name) picks cuda > mps > cpu.
"""

from __future__ import annotations

import torch

from lmforge.errors import LmforgeError

DEVICE_NAMES = "cpu, cuda, cuda:N, mps or auto"


def pick_device(name: str | torch.device | None = None) -> torch.device:
    """The torch device for `name`; a LmforgeError for an unknown or unavailable one."""
    name = str(name).strip() if name is not None else ""
    if name in ("", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    kind, colon, index = name.partition(":")
    if kind not in ("cpu", "cuda", "mps") or (colon and not (kind == "cuda" and index.isdigit())):
        raise LmforgeError(f"unknown device {name!r}: use {DEVICE_NAMES}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            why = "this PyTorch is built without CUDA" if torch.version.cuda is None else "no GPU"
            raise LmforgeError(
                f"device {name!r} requested but CUDA is not available ({why}): use --device cpu"
            )
        count = torch.cuda.device_count()
        if colon and int(index) >= count:
            raise LmforgeError(
                f"device {name!r} requested but this machine has {count} CUDA device(s): "
                f"use cuda:0 to cuda:{count - 1}"
            )
    if kind == "mps" and not _mps_available():
        raise LmforgeError(
            f"device {name!r} requested but Apple's Metal (MPS) is not available here: "
            "use --device cpu"
        )
    return torch.device(name)


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps and mps.is_available())
