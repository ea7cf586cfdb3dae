"""Writing `.safetensors` files: every one lmforge writes (checkpoints, exports, imports) goes
through here, so they get the permissions every other file gets.

safetensors creates its files private (mode 0600), whatever the umask; `honour_umask` gives a
written file the mode `open()` would have (0666 less the umask, 0644 under the usual 022).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported by the writers only: `honour_umask` serves torch-free code
    import torch


def save_tensors(
    tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """safetensors' `save_file`, with the file's mode as the umask says."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    honour_umask(path)


def save_module(model: torch.nn.Module, path: str | Path) -> None:
    """safetensors' `save_model` (shared tensors stored once), with the mode as the umask says."""
    from safetensors.torch import save_model

    save_model(model, str(path))
    honour_umask(path)


def honour_umask(path: str | Path) -> None:
    """Set a file's mode to 0666 less the process umask, as for a file made by `open()`."""
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    try:  # Linux exposes the umask without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: read by setting it, and put it straight back
    os.umask(mask)
    return mask
