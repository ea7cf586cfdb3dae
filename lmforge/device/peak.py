"""This machine's peak matmul FLOP/s per dtype, measured once and cached on disk.

A timed large matmul per dtype, cached in `$LMFORGE_CACHE/peak_flops.json` (default
`~/.cache/lmforge`) under the processor, the ISA torch dispatches to, the thread count, the
torch version and the dtype. MFU divides by it, the planner's `cpu-local` device is built from
it, and the capability module compares bf16 with fp32 through it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from lmforge.atomic import write_json
from lmforge.device.cpuinfo import read_cpuinfo

DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}
MEASURE_SECONDS = 0.9
MEASURE_SIZES = (512, 2048, 128)  # the first one sizes up whether the big one is affordable


def measured_peak_flops(device: torch.device | str, dtype: str) -> float:
    """Peak matmul FLOP/s of `device` in `dtype`, measured here (fp8 is measured as bf16)."""
    device = torch.device(device)
    measured_dtype = "bf16" if dtype == "fp8" else dtype  # no fp8 matmul on most devices
    key = "|".join([machine_key(device), measured_dtype])
    return cached(
        cache_dir() / "peak_flops.json", key, lambda: measure_matmul_flops(device, measured_dtype)
    )


def measure_matmul_flops(
    device: torch.device | str, dtype: str, seconds: float = MEASURE_SECONDS
) -> float:
    """Best FLOP/s of square matmuls of a few sizes, timed for about `seconds` in all.

    Several sizes, because a dtype without native kernels (fp16 on most CPUs) is fastest on
    small matrices while native kernels need large ones to reach their peak."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(0)  # leave the global RNG untouched
    best = 0.0
    for size in MEASURE_SIZES:
        if best and 2.0 * size**3 / best > seconds / len(MEASURE_SIZES):
            continue  # one matmul of this size would take longer than its share of the time
        a = torch.randn(size, size, device=device, generator=generator).to(DTYPES[dtype])
        b = torch.randn(size, size, device=device, generator=generator).to(DTYPES[dtype])
        flops = 2.0 * size**3
        a @ b  # warm-up: kernel selection, page faults
        deadline = time.perf_counter() + seconds / len(MEASURE_SIZES)
        while True:
            synchronize(device)
            t0 = time.perf_counter()
            a @ b
            synchronize(device)
            best = max(best, flops / (time.perf_counter() - t0))
            if time.perf_counter() > deadline:
                break
    return best


def machine_key(device: torch.device) -> str:
    """What a measurement on `device` depends on: processor, ISA, threads, torch version."""
    parts = [processor_name(device)]
    if device.type == "cpu":
        parts.append(torch.backends.cpu.get_cpu_capability())
        parts.append(os.environ.get("ONEDNN_MAX_CPU_ISA", ""))  # oneDNN's own ISA cap
    return "|".join([*parts, str(torch.get_num_threads()), torch.__version__])


def processor_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    info = read_cpuinfo()
    return info.model or info.arch


def cache_dir() -> Path:
    return Path(os.environ.get("LMFORGE_CACHE", Path.home() / ".cache" / "lmforge"))


def cached(path: Path, key: str, measure: Callable[[], float]) -> float:
    """`measure()` stored under `key` in the JSON file at `path`, measured on first use only."""
    try:
        cache = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    if key not in cache:
        cache[key] = measure()
        write_json(path, cache, indent=1)
    return float(cache[key])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
