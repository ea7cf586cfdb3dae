"""lmforge's CPU decode kernels: weight-only products of a few activation rows with an int8,
packed int4, bf16 or fp32 weight, at the speed of the bytes they read; a decode step's
attention read straight from the paged KV cache; and sampling a token per row of logits
(kernels/cpu/*.cpp).

A batch-1 decode step reads every weight once, so its speed is memory bandwidth over bytes per
weight. torch's generic ops reach about a third of the bandwidth on a matrix-vector product
and cannot read int4 codes without writing a float copy of the weight; these kernels read the
weight once and reuse each loaded piece of it for every row of x. Float weights are widened to
fp32 in registers; integer codes are multiplied as integers against x rounded to int16 per row
(a relative step of 2^-16: 128 times finer than bf16), which takes a third of the instructions
of converting every code to fp32 and is what lets int4 run faster than int8.

The C++ is compiled once per source, torch version and compiler, with this machine's compiler
(torch.compile needs the same one), into `kernel_dir()` (`make` does it at install; otherwise
the first use does, in about 15 s). Each instruction set's kernels are separate functions in
one library and the operator takes the set to run as an argument, so the choice is made in one
place (`isa_for`, from the capability module) and every set this CPU can run is tested on it.
Where no kernel can run (no compiler, not x86-64, a CPU without AVX2), callers keep torch's
ops: `isa_for` returns None.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch

from lmforge.device.capability import (
    PROFILE_ENV,
    CpuCapability,
    compiler_version,
    cpp_compiler,
    cpu_capability,
)

SOURCE_DIR = Path(__file__).parent / "cpu"
ISA_FLAGS = {  # the instruction sets, widest first, and what their file is compiled with
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma"),
    "avx2": ("-mavx2", "-mfma"),
}
MAX_ROWS = 8  # rows of x the kernels hold in registers; more rows pass over the weight again
K_MULTIPLE = 16  # the inputs of a weight must be a multiple of this (both vector widths)
TILE_ROWS, UNIT = 8, 16  # a tiled weight's rows per tile and elements per interleaved piece


def isa_for(capability: CpuCapability | None = None) -> str | None:
    """The instruction set of the decode kernels to use on a CPU with `capability` (default:
    this one, under LMFORGE_CPU_PROFILE), or None where none can run and torch's ops serve."""
    if capability is None:
        return _isa_here()
    return capability.decode_isa if capability.decode_isa and load() is None else None


def _isa_here() -> str | None:
    return _isa_under(os.environ.get(PROFILE_ENV))


# torch.compile asks once, while tracing: the mark torch.compiler.assume_constant_result sets,
# set without it, which would import torch._dynamo (1.6 s) into every process that decodes
_isa_here._dynamo_marked_constant = True  # type: ignore[attr-defined]


@functools.cache
def _isa_under(profile: str | None) -> str | None:  # asked once per layer and step: cached
    return isa_for(cpu_capability(profile))


def fits(in_features: int, rows: int) -> bool:
    """The kernels take this matrix and these rows (beyond MAX_ROWS, torch's matmuls win)."""
    return in_features % K_MULTIPLE == 0 and rows <= MAX_ROWS


def can_tile(weight: torch.Tensor) -> bool:
    """Whether `tile` takes this (rows, elements) weight."""
    return weight.dim() == 2 and weight.shape[0] % TILE_ROWS == 0 and weight.shape[1] % UNIT == 0


def tile(weight: torch.Tensor) -> torch.Tensor:
    """A (rows, elements) weight in the kernels' tiled layout, (rows / 8, elements / 16, 8, 16):
    eight rows at a time with their 16-element pieces interleaved, so that the kernels read a
    block of rows as one stream in order, which the hardware prefetcher follows (a row-major
    block is eight short streams; decode_kernels.h). Every kernel takes either layout."""
    rows, elements = weight.shape
    tiles = weight.view(rows // TILE_ROWS, TILE_ROWS, elements // UNIT, UNIT)
    return tiles.transpose(1, 2).contiguous()


def untile(weight: torch.Tensor) -> torch.Tensor:
    """A weight as `tile` gave it, row-major again (anything else is returned as it is)."""
    if weight.dim() != 4:
        return weight
    tiles, pieces = weight.shape[:2]
    return weight.transpose(1, 2).reshape(tiles * TILE_ROWS, pieces * UNIT)


def out_features(weight: torch.Tensor) -> int:
    """The rows of a row-major or tiled weight."""
    return weight.shape[0] * (TILE_ROWS if weight.dim() == 4 else 1)


def dense_mm(x: torch.Tensor, weight: torch.Tensor, isa: str) -> torch.Tensor:
    """x Wᵀ for an fp32 or bf16 W (out, in), row-major or tiled; x in any float dtype, computed
    in fp32."""
    op = torch.ops.lmforge_cpu.dense_mm
    return _rows(x, lambda x2: op(x2, weight, isa), out_features(weight))


def int8_mm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, isa: str) -> torch.Tensor:
    """x Wᵀ for W = qweight (int8, out x in, row-major or tiled) * scales (fp32, per row)."""
    op = torch.ops.lmforge_cpu.int8_mm
    return _rows(x, lambda x2: op(x2, qweight, scales, isa), out_features(qweight))


def int4_mm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    isa: str,
) -> torch.Tensor:
    """x Wᵀ for W in lmforge's packed int4 (quant/schemes.py), row-major or tiled:
    (codes - zeros) * scales."""
    op = torch.ops.lmforge_cpu.int4_mm
    return _rows(
        x, lambda x2: op(x2, qweight, scales, zeros, group_size, isa), out_features(qweight)
    )


def paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    tables: torch.Tensor,
    lengths: torch.Tensor,
    isa: str,
) -> torch.Tensor:
    """A decode step's attention read straight from a paged KV cache (fp32): each row's query
    q (B, H, D) over its `lengths` (B) cached positions, in the blocks its row of `tables`
    (B, W) names in one layer's pools (H_kv, blocks, block_size, D), and then over its new key
    and value (B, H_kv, D), which are not in the pools yet. Gives (B, H, D)."""
    op = torch.ops.lmforge_cpu.paged_attention
    return op(q, k_pool, v_pool, k_new, v_new, tables, lengths, isa)


def sample_rows(x: torch.Tensor, u: torch.Tensor, isa: str) -> torch.Tensor:
    """One token per row of logits x (n, V), -inf where masked: the first whose cumulative
    softmax weight exceeds u (n,) in [0, 1) of the row's total, read in place (nothing written)."""
    return torch.ops.lmforge_cpu.sample_rows(x.float().contiguous(), u.float(), isa)


def integer_activations(x: torch.Tensor) -> torch.Tensor:
    """x as int8_mm and int4_mm multiply it, in fp32: each row rounded to int16 steps of
    max|row| / 32767 (the reference their results are tested against)."""
    largest = x.float().abs().amax(-1, keepdim=True)
    inverse = torch.where(largest > 0, 32767 / largest, 0.0)
    return torch.round(x.float() * inverse) * (largest / 32767)


def _rows(x: torch.Tensor, product, out_features: int) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    return product(x2).to(x.dtype).view(*x.shape[:-1], out_features)


@functools.cache
def load() -> str | None:
    """Build (once) and load the kernels; None when they are ready, else why they are not."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"lmforge's decode kernels are written for x86-64, not {platform.machine()}"
    compiler = cpp_compiler()
    if compiler is None:
        return "lmforge's decode kernels need a C++ compiler (g++ or clang++) and none was found"
    try:
        torch.ops.load_library(str(build(compiler)))
    except (OSError, subprocess.CalledProcessError) as e:
        reason = f"lmforge's decode kernels failed to build or load ({e}): using torch's ops"
        warnings.warn(reason, stacklevel=2)
        return reason
    _register_fakes()
    return None


def library_path(compiler: str) -> Path:
    """Where the library built from these sources, for this torch and compiler, lives."""
    digest = hashlib.sha256()
    for source in sorted(SOURCE_DIR.iterdir()):
        digest.update(source.name.encode() + source.read_bytes())
    version = compiler_version(compiler)
    digest.update(f"{torch.__version__}|{sys.version_info[:2]}|{version}".encode())
    return kernel_dir() / f"decode-{digest.hexdigest()[:16]}.so"


def kernel_dir() -> Path:
    """$LMFORGE_KERNEL_CACHE, else ~/.cache/lmforge/kernels: build outputs, apart from
    LMFORGE_CACHE's measurements (a test isolates those, and must not rebuild the kernels)."""
    default = Path.home() / ".cache" / "lmforge" / "kernels"
    return Path(os.environ.get("LMFORGE_KERNEL_CACHE", default))


def build(compiler: str, verbose: bool = False) -> Path:
    """Compile the library unless it is already built; returns its path. Written under a
    temporary name and renamed, so parallel builds never load a half-written file."""
    target = library_path(compiler)
    if target.exists():
        return target
    from torch.utils.cpp_extension import include_paths

    target.parent.mkdir(parents=True, exist_ok=True)
    torch_lib = Path(torch.__file__).parent / "lib"
    if verbose or sys.stderr.isatty():
        print("building lmforge's CPU decode kernels (once)...", file=sys.stderr)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    ops_flags = ["-O2", "-std=c++20", "-fopenmp", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    sources = {  # object: the file and its flags
        **{
            f"{isa}.o": (f"decode_{isa}.cpp", ["-O3", "-std=c++17", *f])
            for isa, f in ISA_FLAGS.items()
        },
        "ops.o": ("decode_ops.cpp", [*ops_flags, *(f"-I{p}" for p in include_paths())]),
    }
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [f"{tmp}/{name}" for name in sources]
        # side by side: the operators' file, with torch's headers, takes as long as the others
        _run_together(
            [compiler, "-fPIC", *flags, "-c", str(SOURCE_DIR / source), "-o", obj]
            for obj, (source, flags) in zip(objects, sources.values(), strict=True)
        )
        linked = f"{tmp}/decode.so"
        libs = [f"-L{torch_lib}", "-lc10", "-ltorch_cpu", "-fopenmp", f"-Wl,-rpath,{torch_lib}"]
        subprocess.run([compiler, "-shared", *objects, "-o", linked, *libs], check=True)
        os.replace(linked, target)
    return target


def _run_together(commands: Iterable[list[str]]) -> None:
    """Run the commands at once and wait for all; raise CalledProcessError for one that failed."""
    processes = [(command, subprocess.Popen(command)) for command in commands]
    failed = [(code, command) for command, process in processes if (code := process.wait())]
    if failed:
        raise subprocess.CalledProcessError(*failed[0])


def _register_fakes() -> None:
    """Shapes for torch.compile, which calls the operators as opaque kernels."""

    def product(x: torch.Tensor, weight: torch.Tensor, *_) -> torch.Tensor:
        return x.new_empty(x.shape[0], out_features(weight))

    for name in ("dense_mm", "int8_mm", "int4_mm"):
        torch.library.register_fake(f"lmforge_cpu::{name}", product)
    torch.library.register_fake("lmforge_cpu::paged_attention", lambda q, *_: torch.empty_like(q))
    torch.library.register_fake(
        "lmforge_cpu::sample_rows", lambda x, *_: x.new_empty(x.shape[0], dtype=torch.long)
    )


if __name__ == "__main__":  # `python -m lmforge.kernels.cpu_decode`: build now (make does)
    print(load() or f"lmforge's CPU decode kernels are ready ({isa_for() or 'not used here'})")
