"""Model FLOPs utilization: a device's peak matmul FLOP/s per dtype, measured or from a table.

MFU is the model's analytic training FLOPs (`Transformer.flops_per_token`) times tokens/s over
the peak of the dtype its matmuls run in. Known GPUs take their dense datasheet peak from
`GPU_PEAKS` (the planner's hardware table); a CPU (or an unknown GPU) is measured once with a
timed large matmul and the result is cached in `$LMFORGE_CACHE/peak_flops.json` (default
`~/.cache/lmforge`), keyed by the processor, thread count, torch version and dtype.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from lmforge.plan.hardware import gpu_peaks

# Dense datasheet peaks, matched as a substring of torch.cuda.get_device_name(): the planner's
# hardware table (lmforge/plan/hardware.toml) is the one source of these numbers.
GPU_PEAKS: dict[str, dict[str, float]] = gpu_peaks()

DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}
MEASURE_SECONDS = 0.9
MEASURE_SIZES = (512, 2048, 128)  # the first one sizes up whether the big one is affordable


def peak_flops(device: torch.device | str, dtype: str) -> float:
    """Peak matmul FLOP/s of `device` in `dtype` (fp32, bf16, fp16 or fp8)."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peaks in GPU_PEAKS.items():
            if key in name and dtype in peaks:
                return peaks[dtype]
    measured_dtype = "bf16" if dtype == "fp8" else dtype  # no fp8 matmul outside the table
    return _cached_measurement(device, measured_dtype)


def mfu(flops_per_token: float, tokens_per_s: float, peak: float) -> float:
    return flops_per_token * tokens_per_s / peak if peak > 0 else 0.0


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
            _sync(device)
            t0 = time.perf_counter()
            a @ b
            _sync(device)
            best = max(best, flops / (time.perf_counter() - t0))
            if time.perf_counter() > deadline:
                break
    return best


def _cached_measurement(device: torch.device, dtype: str) -> float:
    key = "|".join(
        [_processor_name(device), str(torch.get_num_threads()), torch.__version__, dtype]
    )
    path = _cache_dir() / "peak_flops.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    if key not in cache:
        cache[key] = measure_matmul_flops(device, dtype)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1) + "\n")
        os.replace(tmp, path)
    return float(cache[key])


def _cache_dir() -> Path:
    return Path(os.environ.get("LMFORGE_CACHE", Path.home() / ".cache" / "lmforge"))


def _processor_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
