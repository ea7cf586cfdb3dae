"""Training on many processes with torch.distributed: device mesh, DDP, FSDP2, tensor parallel.

Parallelism is applied to a plain model from outside (`parallelize.py`), like precision and
compile in train/compose.py. The same pieces work on any `nn.Module` in a program that starts
its own process group: `World.from_group`, `apply_fsdp`, `apply_ddp`, `build_zero1` and
`full_state_dict`, importable from here. Importing this package is cheap: those names import
torch.distributed only when first used.
"""

import importlib

from lmforge.parallel.layout import Layout, parse_layout

_LIBRARY = {
    "World": "lmforge.parallel.world",
    "apply_ddp": "lmforge.parallel.data_parallel",
    "apply_fsdp": "lmforge.parallel.data_parallel",
    "build_zero1": "lmforge.parallel.data_parallel",
    "gradient_sync": "lmforge.parallel.data_parallel",
    "full_state_dict": "lmforge.parallel.state",
}

__all__ = ["Layout", "parse_layout", *_LIBRARY]


def __getattr__(name: str):
    if name in _LIBRARY:
        return getattr(importlib.import_module(_LIBRARY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
