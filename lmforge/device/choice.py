"""Device choice in one place: cuda > mps > cpu unless the user names one."""

from __future__ import annotations

import torch

from lmforge.errors import LmforgeError


def pick_device(name: str | None = None) -> torch.device:
    if name in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise LmforgeError(f"unknown device {name!r}: use cpu, cuda, cuda:N, mps or auto") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LmforgeError("device 'cuda' requested but CUDA is not available: use --device cpu")
    return device
