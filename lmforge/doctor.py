"""`lmforge doctor`: what this machine can do and which path each choice takes, for users and
bug reports.

Everything printed comes from the modules that make the choices (device.capability and
device.peak, infer's decode layout, train's precision `auto`), so the report cannot disagree
with what a command would do. It sits beside cli.py because it asks every stage.
"""

from __future__ import annotations

import json
import os
import platform
import time

import torch

from lmforge.device.capability import (
    CpuCapability,
    cpp_compiler,
    cpu_capability,
)
from lmforge.device.peak import measured_peak_flops
from lmforge.eval.sandbox import bwrap_unavailable, requested
from lmforge.infer.weight_layouts import decode_layout
from lmforge.kernels import cpu_decode
from lmforge.train.precision import auto_precision

X86_FLAGS = (
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "amx_bf16",
    "avx_ne_convert",
)
ARM_FLAGS = ("asimd", "asimddp", "bf16", "i8mm", "sve", "sve2", "sme")


def diagnose() -> dict:
    """Every fact `doctor` prints, as plain data (its --json output)."""
    cap = cpu_capability()
    cpu = torch.device("cpu")
    fp32 = torch.empty(64, 64)  # the shape of a model's weight, as the layouts see it
    bf16 = fp32.bfloat16()
    flags = ARM_FLAGS if cap.arch == "aarch64" else X86_FLAGS
    return {
        "lmforge": _version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": {
            "model": cap.model,
            "arch": cap.arch,
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "torch_threads": torch.get_num_threads(),
            "isa": cap.isa,
            "class": cap.machine_class,
            "flags": {flag: flag in cap.features for flag in flags},
            "profile": cap.profile,
            "glibc": cap.glibc,
        },
        "kernels": {
            "onednn_packing": {
                "fp32": cap.can_pack(torch.float32),
                "bf16": cap.can_pack(torch.bfloat16),
            },
            "int8_weight_mm": cap.int8_weight_mm,
            "decode_kernels": cpu_decode.isa_for(cap) or _no_decode_kernels(cap),
            "gflops": {
                dtype: round(measured_peak_flops(cpu, dtype) / 1e9, 1)
                for dtype in ("fp32", "bf16", "fp16")
            },
            "int8_weight_mm_gflops": round(int8_weight_mm_flops() / 1e9, 1)
            if cap.int8_weight_mm
            else None,
        },
        "choices": {
            "precision_auto": auto_precision(cpu),
            "bf16_fast": cap.fast_bf16(),
            "decode_layout": {
                "fp32, 1 slot": decode_layout(fp32, 1, capability=cap),
                "fp32, 1 slot, compiled": decode_layout(fp32, 1, True, capability=cap),
                "fp32, 8 slots": decode_layout(fp32, 8, capability=cap),
                "bf16, 1 slot": decode_layout(bf16, 1, capability=cap),
                "bf16, 8 slots": decode_layout(bf16, 8, capability=cap),
            },
        },
        "compile": {"cpp_compiler": cpp_compiler()},
        "sandbox": _sandbox(),
        "gpu": _gpu(),
    }


def _no_decode_kernels(cap: CpuCapability) -> str:
    if cap.decode_isa is None:
        return "none (this CPU has neither AVX2 nor AVX-512): torch's ops"
    return f"none ({cpu_decode.load()})"


def int8_weight_mm_flops(size: int = 2048, rows: int = 1, seconds: float = 0.3) -> float:
    """Best FLOP/s of torch._weight_int8pack_mm: `rows` activations by a size x size int8
    weight (the int8 weight-only decode kernel)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (size, size), dtype=torch.int8, generator=generator)
    scales = torch.rand(size, generator=generator)
    x = torch.randn(rows, size, generator=generator)
    torch._weight_int8pack_mm(x, weight, scales)
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch._weight_int8pack_mm(x, weight, scales)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * rows * size * size / best


def render(facts: dict) -> str:
    """The report as aligned text lines."""
    cpu, kernels, choices = facts["cpu"], facts["kernels"], facts["choices"]

    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    flags = " ".join(f"{name}{'' if on else ' (no)'}" for name, on in cpu["flags"].items())
    gflops = ", ".join(f"{dtype} {value:,}" for dtype, value in kernels["gflops"].items())
    packing = ", ".join(f"{dtype} {yes(on)}" for dtype, on in kernels["onednn_packing"].items())
    int8 = yes(kernels["int8_weight_mm"])
    if kernels["int8_weight_mm_gflops"] is not None:
        int8 += f" ({kernels['int8_weight_mm_gflops']:,} GFLOP/s, one row)"
    lines = [
        ("lmforge", f"{facts['lmforge']} (torch {facts['torch']}, Python {facts['python']})"),
        ("CPU", f"{cpu['model'] or 'unknown'} ({cpu['arch']}, class {cpu['class']})"),
        ("cores", f"{cpu['cores']} usable, torch uses {cpu['torch_threads']} threads"),
        ("ISA", f"{cpu['isa']} (torch's kernels); flags: {flags}"),
        ("profile", cpu["profile"] or "none forced (LMFORGE_CPU_PROFILE caps it)"),
        ("matmul GFLOP/s", gflops + " (measured once, cached)"),
        ("oneDNN packing", packing),
        ("int8 weight mm", int8),
        ("decode kernels", kernels["decode_kernels"]),
        (
            "precision auto",
            f"{choices['precision_auto']} (bf16 fast here: {yes(choices['bf16_fast'])})",
        ),
        *[(f"decode {k}", v) for k, v in choices["decode_layout"].items()],
        ("torch.compile", facts["compile"]["cpp_compiler"] or "unavailable: no C++ compiler"),
        ("glibc mallopt", yes(cpu["glibc"])),
        ("code sandbox", facts["sandbox"]),
        ("GPU", facts["gpu"]),
    ]
    width = max(len(name) for name, _ in lines)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in lines)


def run_doctor(as_json: bool = False) -> str:
    facts = diagnose()
    return json.dumps(facts, indent=1) if as_json else render(facts)


def _sandbox() -> str:
    """What model-written code (HumanEval) runs behind here, and why (eval/sandbox.py)."""
    if requested() == "guard":
        return "guard only (LMFORGE_SANDBOX=guard)"
    reason = bwrap_unavailable()
    return "bubblewrap" if reason is None else f"guard only: {reason}"


def _gpu() -> str:
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return f"CUDA: {', '.join(names)}"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "Apple MPS"
    return "none (torch sees no CUDA or MPS device)"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lmforge")
    except PackageNotFoundError:
        return "unknown"
