"""What the planner reads from the rest of lmforge, handed to it as plain data.

plan/ is pure arithmetic that imports neither torch nor lmforge's configs. This module sits
above both: it turns preset names and TOML run configs (config.py) into `ModelShape`s, and
measures this machine as the `cpu-local` device (device/, with torch, only when asked for).
"""

from __future__ import annotations

from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.plan import hardware
from lmforge.plan.hardware import CPU_LOCAL, Device
from lmforge.plan.shapes import LMFORGE_PREFIX, PUBLISHED, ModelShape, from_model_config


def shape_names() -> list[str]:
    from lmforge.config import PRESETS

    shadowed = [LMFORGE_PREFIX + name for name in PRESETS if name in PUBLISHED]
    return [*PRESETS, *shadowed, *(n for n in PUBLISHED if n not in PRESETS)]


def resolve(model: str) -> ModelShape:
    """A preset name, a published shape's name, or the path of a TOML run config."""
    from lmforge.config import PRESETS, load_config

    if model in PUBLISHED:
        return PUBLISHED[model]()
    preset_name = model.removeprefix(LMFORGE_PREFIX)
    if preset_name in PRESETS:
        return from_model_config(model, PRESETS[preset_name]().model)
    if model.endswith(".toml") or Path(model).exists():
        cfg = load_config(path=model)
        cfg.model.validate()
        return from_model_config(cfg.name, cfg.model)
    raise LmforgeError(
        f"--model {model!r} is neither a preset nor a TOML config file: "
        f"choose one of {', '.join(shape_names())} or pass a config path"
    )


def device(key: str) -> Device:
    """A device of the hardware table, or `cpu-local`: this machine, measured once and cached."""
    return cpu_local_device() if key == CPU_LOCAL else hardware.device(key)


def cpu_local_device() -> Device:
    """This machine as a planner device: matmul FLOP/s from `device.peak` (the measurement MFU
    uses) and read bandwidth from `device.bandwidth`, cached under the processor, thread count
    and torch version in `$LMFORGE_CACHE/cpu_local.json`."""
    import torch

    from lmforge.device.bandwidth import BUFFER_BYTES, measure_read_bandwidth, total_memory
    from lmforge.device.peak import (
        cache_dir,
        cached,
        machine_key,
        measured_peak_flops,
        processor_name,
    )

    cpu = torch.device("cpu")
    bandwidth = cached(cache_dir() / "cpu_local.json", machine_key(cpu), measure_read_bandwidth)
    return Device(
        key=CPU_LOCAL,
        name=f"this machine ({processor_name(cpu)}, {torch.get_num_threads()} threads)",
        flops={dtype: measured_peak_flops(cpu, dtype) for dtype in ("fp32", "bf16")},
        memory_bytes=float(total_memory()),
        memory_bandwidth=bandwidth,
        source=f"measured here: timed matmuls and a {BUFFER_BYTES // 2**20} MiB read (cached)",
    )


def default_precision(hardware_name: str) -> tuple[str, str]:
    """bf16 on the table's accelerators; on `cpu-local`, what training's `precision = "auto"`
    picks on this CPU (bf16 only where it measured faster); with the rule as a sentence."""
    if hardware_name != CPU_LOCAL:
        return "bf16", ""
    from lmforge.device.capability import cpu_capability

    if cpu_capability().fast_bf16():
        return "bf16", "auto: bf16 measured faster than fp32 on this CPU"
    return "fp32", "auto: bf16 is not faster than fp32 on this CPU"
