"""Triton kernels (the `kernels` extra) and the one place that says whether they can run.

Each module holds one kernel, forward and backward, with the PyTorch reference it equals named
in its docstring. Nothing here imports triton until a kernel module is loaded, so importing
lmforge never pays for (or needs) triton.

Triton runs on CUDA (and ROCm) GPUs, or anywhere under its interpreter (`TRITON_INTERPRET=1`,
read by `triton.jit` when a kernel module is first imported: the setting at that moment decides
how that module's kernels run for the rest of the process). The interpreter runs each program
in NumPy: exact in fp32 and slow, for tests; its bf16 `tl.dot` is wrong (triton issue 11584),
so bf16 runs only on a GPU.

Each module records the mode it was imported in (`INTERPRETED`), and `unavailable` asks a
loaded module rather than the environment. triton.language's own helpers take their mode when
triton is first imported, which torch does early (torch._dynamo imports it): tests therefore
run kernels through interpreted.run_interpreted, in a child process interpreted from the start.

Wiring (for the trainer): ask `unavailable(name, device, dtype)` once when the model is built;
None means `load(name)` gives a module whose kernel can replace the PyTorch path.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

import torch

from lmforge.errors import LmforgeError

KERNELS = ("flash_attention", "rmsnorm", "swiglu", "rope", "linear_cross_entropy", "matmul")
# kernels whose bf16 path goes through tl.dot, wrong under the interpreter
_DOT_KERNELS = frozenset({"flash_attention", "matmul"})


def interpreting(name: str | None = None) -> bool:
    """Whether kernel `name` runs under Triton's interpreter: as it was loaded, or, not loaded
    yet (or no name), as kernels imported now would."""
    module = sys.modules.get(f"{__name__}.{name}") if name else None
    if module is not None:
        return module.INTERPRETED
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def configs(gpu: list, interpreted: list) -> list:
    """Autotune configs: `gpu` on a GPU, `interpreted` (one, with small blocks so tiny test
    shapes span several) under the interpreter, whose autotuner would time each with CUDA."""
    return interpreted if interpreting() else gpu


def installed() -> bool:
    """Whether the triton package is installed (nothing is imported)."""
    return importlib.util.find_spec("triton") is not None


def unavailable(
    name: str = "rmsnorm", device: torch.device | str = "cuda", dtype: torch.dtype = torch.float32
) -> str | None:
    """Why kernel `name` cannot run on `device` in `dtype` here, or None when it can."""
    if name not in KERNELS:
        raise LmforgeError(f"unknown Triton kernel {name!r}: use one of {', '.join(KERNELS)}")
    if not installed():
        return "Triton kernels need triton (not installed): pip install 'lmforge[kernels]'"
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"Triton kernels run in fp32, bf16 or fp16, not {dtype}"
    device = torch.device(device)
    if interpreting(name):
        if "triton" in sys.modules:
            from lmforge.kernels.triton.interpreted import triton_interpreted

            if not triton_interpreted():
                return "TRITON_INTERPRET=1 was set after triton was imported (set it before torch)"
        if dtype != torch.float32 and name in _DOT_KERNELS:
            return f"the Triton interpreter's {dtype} tl.dot is wrong (triton issue 11584)"
        return None
    if device.type != "cuda":
        return f"Triton kernels run on a GPU, not on {device.type} (or set TRITON_INTERPRET=1)"
    if not torch.cuda.is_available():
        return "Triton kernels need a GPU and CUDA is not available here"
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16 (compute capability 8.0 or later)"
    return None


def available(device: torch.device | str = "cuda", dtype: torch.dtype = torch.float32) -> bool:
    """Whether every Triton kernel can run on `device` in `dtype` here."""
    return all(unavailable(name, device, dtype) is None for name in KERNELS)


def triton_rmsnorm_available(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether the Triton RMSNorm can replace lmforge.model.layers.RMSNorm on `device`."""
    return unavailable("rmsnorm", device, dtype) is None


def load(name: str) -> ModuleType:
    """The module of kernel `name` (imports triton); a LmforgeError naming the fix when triton
    is missing, or when TRITON_INTERPRET=1 was set only after triton was imported."""
    if name not in KERNELS:
        raise LmforgeError(f"unknown Triton kernel {name!r}: use one of {', '.join(KERNELS)}")
    if not installed():
        raise LmforgeError(
            f"the Triton {name} kernel needs triton (not installed): pip install 'lmforge[kernels]'"
        )
    module = importlib.import_module(f"{__name__}.{name}")
    if module.INTERPRETED:
        from lmforge.kernels.triton.interpreted import triton_interpreted

        if not triton_interpreted():
            raise LmforgeError(
                "TRITON_INTERPRET=1 was set after triton was imported (torch._dynamo imports "
                "it), so its kernels cannot be interpreted: set it before importing torch, or "
                "call them through lmforge.kernels.triton.interpreted.run_interpreted"
            )
    return module
