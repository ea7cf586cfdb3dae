"""What the operating system says about the CPU: its architecture, model name and feature flags.

Torch-free parsing of Linux's `/proc/cpuinfo` (x86 `flags`, ARM `Features`) and macOS's
`sysctl` output, so the detection is unit-tested with fixtures of every kind of machine, ARM
included, on whatever machine runs the tests. Feature names are normalised to the Linux x86
spelling (`avx512_bf16`, `amx_bf16`, `avx_ne_convert`) and to Linux's ARM names (`asimd` for
NEON, `bf16`, `i8mm`, `sve`), whichever OS reported them.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

# macOS's sysctl `hw.optional.*` keys, by the Linux name of the same feature.
_MACOS_ARM_FEATURES = {
    "hw.optional.neon": "asimd",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_DotProd": "asimddp",
    "hw.optional.arm.FEAT_FP16": "fphp",
    "hw.optional.arm.FEAT_SME": "sme",
}
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8": "aarch64"}


@dataclass(frozen=True)
class CpuInfo:
    arch: str  # x86_64, aarch64, or whatever platform.machine() says elsewhere
    model: str  # "AMD EPYC 9R14", "Apple M2"; "" when the OS does not say
    features: frozenset[str]


def normalise_arch(machine: str) -> str:
    machine = machine.strip().lower()
    return _ARCH_ALIASES.get(machine, machine)


def parse_proc_cpuinfo(text: str, arch: str) -> CpuInfo:
    """The first processor's model name and flags from Linux's /proc/cpuinfo."""
    model, features = "", frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not features:
            features = frozenset(value.split())
    return CpuInfo(normalise_arch(arch), model, features)


def parse_sysctl(text: str, arch: str) -> CpuInfo:
    """macOS's `sysctl -a` lines (`key: value`) as a CpuInfo."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip()
    features = {name for key, name in _MACOS_ARM_FEATURES.items() if values.get(key) == "1"}
    for key in ("machdep.cpu.features", "machdep.cpu.leaf7_features"):  # Intel Macs
        features.update(flag.lower().replace(".", "_") for flag in values.get(key, "").split())
    return CpuInfo(
        normalise_arch(arch), values.get("machdep.cpu.brand_string", ""), frozenset(features)
    )


@functools.cache
def read_cpuinfo() -> CpuInfo:
    """This machine's CpuInfo; missing sources give an empty model and feature set."""
    arch = platform.machine()
    try:
        return parse_proc_cpuinfo(Path("/proc/cpuinfo").read_text(), arch)
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-a"], capture_output=True, text=True, timeout=5)
            return parse_sysctl(out.stdout, arch)
        except (OSError, subprocess.SubprocessError):
            pass
    return CpuInfo(normalise_arch(arch), platform.processor(), frozenset())


def cpu_class(info: CpuInfo) -> str:
    """The named class of machine (capability.PROFILES) the flags put this CPU in."""
    flags = info.features
    if info.arch == "x86_64":
        if flags & {"avx512_bf16", "amx_bf16"}:
            return "avx512-bf16"
        if {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags:
            return "avx512"  # oneDNN packs bf16 weights; bf16 arithmetic is not native
        return "avx2" if "avx2" in flags else "generic"
    if info.arch == "aarch64":
        if "bf16" in flags:
            return "arm-bf16"
        return "neon" if "asimd" in flags else "generic"
    return "generic"
