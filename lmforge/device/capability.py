"""What this CPU can do, found once per process: the one place every CPU fast path asks.

CPUs differ in ways that decide which kernel is fastest, or whether a kernel runs at all:
oneDNN prepacks bf16 weights only with AVX512-BW/VL/DQ or AVX-NE-CONVERT (elsewhere it
raises), bf16 matmuls are native with AVX512-BF16, AMX or ARM's BF16 and emulated, 25x slower
than fp32, on AVX2, and Inductor needs a C++ compiler. So nothing is assumed from the
architecture: each kernel lmforge relies on is tried once on a tiny input and checked against
the plain result, and bf16's speed is measured (`fast_bf16`, cached on disk by device.peak).

`LMFORGE_CPU_PROFILE` (or `cpu_capability(profile=...)`) caps what is used at a named class
of machine, so the fallback each choice takes on a smaller CPU runs, and is tested, on any
machine: a profile only takes capabilities away, never adds ones the CPU lacks.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import subprocess
import sys
import warnings
from dataclasses import dataclass, field, replace

import torch

from lmforge.device.cpuinfo import CpuInfo, cpu_class, read_cpuinfo
from lmforge.errors import LmforgeError

PROFILE_ENV = "LMFORGE_CPU_PROFILE"
BF16_FAST_RATIO = 1.5  # bf16 is "fast" when its measured matmul peak beats fp32's by this much


@dataclass(frozen=True)
class Profile:
    """A ceiling on capabilities: what a named class of machine could have at most."""

    packed_dtypes: frozenset[torch.dtype]
    int8_weight_mm: bool
    bf16: bool  # may bf16 matmuls count as fast
    decode_isa: str | None  # the widest of lmforge's decode kernels (kernels/cpu_decode.py)


PROFILES = {
    # Zen 4, Sapphire Rapids and later: everything
    "avx512-bf16": Profile(frozenset({torch.float32, torch.bfloat16}), True, True, "avx512"),
    # Skylake-X to Ice Lake: oneDNN packs bf16 weights, but bf16 arithmetic is emulated
    "avx512": Profile(frozenset({torch.float32, torch.bfloat16}), True, False, "avx512"),
    # Zen 3 and earlier, Intel laptops: oneDNN packs fp32 only
    "avx2": Profile(frozenset({torch.float32}), True, False, "avx2"),
    # aarch64 with BF16 (Graviton 3, Apple M2 and later)
    "arm-bf16": Profile(frozenset({torch.float32, torch.bfloat16}), True, True, None),
    # aarch64 without BF16 (Graviton 2, Apple M1, Raspberry Pi)
    "neon": Profile(frozenset({torch.float32}), True, False, None),
    # no vector ISA known: only the plain kernels
    "generic": Profile(frozenset(), False, False, None),
}


@dataclass(frozen=True)
class CpuCapability:
    """The CPU's ISA and the kernels found working on it (under `profile`'s ceiling)."""

    arch: str  # x86_64, aarch64, ...
    model: str  # the processor's name
    isa: str  # the vector ISA torch's own kernels dispatch to: AVX512, AVX2, SVE256, DEFAULT
    machine_class: str  # the PROFILES name its flags put it in (cpuinfo.cpu_class)
    features: frozenset[str] = field(repr=False)  # the OS's flags (cpuinfo.py's spelling)
    packed_dtypes: frozenset[torch.dtype]  # dtypes whose weights oneDNN prepacks here
    int8_weight_mm: bool  # torch._weight_int8pack_mm (int8 weight-only matmul) works
    decode_isa: str | None = None  # "avx512" | "avx2": the decode kernels' widest set here
    bf16_allowed: bool = True  # False when a forced profile rules bf16 out as fast
    glibc: bool = False  # glibc is the C library (mallopt exists)
    profile: str | None = None  # the forced profile, if any

    def can_pack(self, dtype: torch.dtype) -> bool:
        return dtype in self.packed_dtypes

    def fast_bf16(self) -> bool:
        """bf16 matmuls measured at least BF16_FAST_RATIO x fp32 here (measured once, cached)."""
        return self.bf16_allowed and bf16_speedup() >= BF16_FAST_RATIO

    def capped(self, profile: str) -> CpuCapability:
        """This capability under the ceiling of `profile` (one of PROFILES)."""
        ceiling = _profile(profile)
        return replace(
            self,
            packed_dtypes=self.packed_dtypes & ceiling.packed_dtypes,
            int8_weight_mm=self.int8_weight_mm and ceiling.int8_weight_mm,
            decode_isa=narrower(self.decode_isa, ceiling.decode_isa),
            bf16_allowed=self.bf16_allowed and ceiling.bf16,
            profile=profile,
        )


def profile_capability(profile: str) -> CpuCapability:
    """A made-up CPU with exactly `profile`'s capabilities: what each choice does on a class
    of machine can be tested on any machine."""
    ceiling = _profile(profile)
    arch = "aarch64" if profile in ("arm-bf16", "neon") else "x86_64"
    return CpuCapability(
        arch=arch,
        model=f"{profile} profile",
        isa=profile.upper(),
        machine_class=profile,
        features=frozenset(),
        packed_dtypes=ceiling.packed_dtypes,
        int8_weight_mm=ceiling.int8_weight_mm,
        decode_isa=ceiling.decode_isa,
        bf16_allowed=ceiling.bf16,
        profile=profile,
    )


def cpu_capability(profile: str | None = None) -> CpuCapability:
    """This CPU's capability, detected once per process; capped at `profile` or at
    $LMFORGE_CPU_PROFILE when either is given."""
    profile = profile or os.environ.get(PROFILE_ENV) or None
    detected = detect()
    return detected.capped(profile) if profile else detected


def _profile(name: str) -> Profile:
    if name not in PROFILES:
        raise LmforgeError(
            f"unknown CPU profile {name!r} ({PROFILE_ENV}): choose one of "
            f"{', '.join(PROFILES)}, or unset it to use what this CPU has"
        )
    return PROFILES[name]


@functools.cache
def detect() -> CpuCapability:
    """Probe this CPU (tiny inputs, about 70 ms); cached for the process."""
    return capability_from(read_cpuinfo())


def capability_from(info: CpuInfo) -> CpuCapability:
    return CpuCapability(
        arch=info.arch,
        model=info.model,
        isa=torch.backends.cpu.get_cpu_capability(),
        machine_class=cpu_class(info),
        features=info.features,
        packed_dtypes=frozenset(d for d in (torch.float32, torch.bfloat16) if probe_packing(d)),
        int8_weight_mm=probe_int8_weight_mm(),
        decode_isa=decode_isa(info),
        glibc=platform.libc_ver()[0] == "glibc",
    )


DECODE_ISAS = ("avx2", "avx512")  # narrowest first
_DECODE_ISA_FLAGS = {
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma"},
    "avx2": {"avx2", "fma"},
}


def decode_isa(info: CpuInfo) -> str | None:
    """The widest instruction set of lmforge's decode kernels whose flags this CPU has."""
    if info.arch != "x86_64":
        return None
    return next(
        (isa for isa in reversed(DECODE_ISAS) if _DECODE_ISA_FLAGS[isa] <= info.features), None
    )


def narrower(a: str | None, b: str | None) -> str | None:
    """The narrower of two decode instruction sets (None is narrowest: no kernel)."""
    if a is None or b is None:
        return None
    return min(a, b, key=DECODE_ISAS.index)


def probe_packing(dtype: torch.dtype) -> bool:
    """oneDNN can prepack a `dtype` weight and its packed matmul gives the plain result."""
    if not torch.backends.mkldnn.is_available():
        return False
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 32, generator=generator).to(dtype)
    x = torch.randn(2, 32, generator=generator).to(dtype)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 2)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (RuntimeError, AttributeError):  # this CPU's oneDNN build refuses the dtype
        return False
    want = torch.nn.functional.linear(x.float(), weight.float())
    return torch.allclose(got.float(), want, atol=0.1, rtol=0.05)


def probe_int8_weight_mm() -> bool:
    """torch._weight_int8pack_mm runs here and gives the dequantised product."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (16, 32), dtype=torch.int8, generator=generator)
    scales = torch.rand(16, generator=generator) + 0.5
    x = torch.randn(2, 32, generator=generator)
    try:
        got = torch._weight_int8pack_mm(x, weight, scales)
    except (RuntimeError, AttributeError):
        return False
    want = x @ (weight.float() * scales[:, None]).T
    return torch.allclose(got, want, atol=1e-3, rtol=1e-3)


def bf16_speedup() -> float:
    """Measured bf16 matmul peak over fp32's on this CPU (cached on disk by device.peak)."""
    from lmforge.device.peak import measured_peak_flops

    return measured_peak_flops("cpu", "bf16") / measured_peak_flops("cpu", "fp32")


@functools.cache
def cpp_compiler() -> str | None:
    """The C++ compiler Inductor uses (torch.compile on a CPU needs one), or None where it does
    not run: $CXX, else g++ (clang++ on macOS), as torch._inductor.config.cpp.cxx chooses, looked
    for here without importing Inductor, which would load torch._dynamo (1.7 s) into every
    process that decodes."""
    compiler = os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")
    return compiler if compiler_version(compiler) is not None else None


@functools.cache
def compiler_version(compiler: str) -> str | None:
    """What `compiler --version` prints, or None where it does not run."""
    try:
        done = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, check=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def compile_unavailable(device: torch.device | str) -> str | None:
    """Why torch.compile cannot run on `device` here, or None when it can."""
    device_type = torch.device(device).type
    if device_type == "cpu" and cpp_compiler() is None:
        return "torch.compile on a CPU needs a C++ compiler (g++ or clang++) and none was found"
    if device_type == "cuda" and importlib.util.find_spec("triton") is None:
        return "torch.compile on a GPU needs triton (pip install triton)"
    return None


def use_compile(requested: bool, device: torch.device | str) -> bool:
    """`requested`, unless torch.compile cannot run on `device`: then a warning, and eager
    (the same results, only slower)."""
    if requested and (reason := compile_unavailable(device)):
        warnings.warn(f"{reason}: running eagerly instead", stacklevel=2)
        return False
    return requested
