"""Model FLOPs utilization: the model's training FLOP/s over the peak of the dtype it runs in.

MFU is the model's analytic training FLOPs (`Transformer.flops_per_token`) times tokens/s over
the peak of the dtype its matmuls run in. Known GPUs take their dense datasheet peak from
`GPU_PEAKS` (the planner's hardware table); a CPU (or an unknown GPU) is measured once and
cached (`lmforge.device.peak`).
"""

from __future__ import annotations

import torch

from lmforge.device.peak import measured_peak_flops
from lmforge.plan.hardware import gpu_peaks

# Dense datasheet peaks, matched as a substring of torch.cuda.get_device_name(): the planner's
# hardware table (lmforge/plan/hardware.toml) is the one source of these numbers.
GPU_PEAKS: dict[str, dict[str, float]] = gpu_peaks()


def peak_flops(device: torch.device | str, dtype: str) -> float:
    """Peak matmul FLOP/s of `device` in `dtype` (fp32, bf16, fp16 or fp8)."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peaks in GPU_PEAKS.items():
            if key in name and dtype in peaks:
                return peaks[dtype]
    return measured_peak_flops(device, dtype)


def mfu(flops_per_token: float, tokens_per_s: float, peak: float) -> float:
    return flops_per_token * tokens_per_s / peak if peak > 0 else 0.0
