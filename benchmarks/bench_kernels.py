"""Kernels side by side with their references, one run: attention, linear + cross-entropy,
RMSNorm and matmul.

On a GPU (torch.cuda.is_available()), bf16, each Triton kernel of lmforge.kernels.triton
against what training would otherwise run:
- attention: Triton FlashAttention-2 vs SDPA's flash backend, causal and not, seq 1k-16k at
  16k tokens per batch (16 heads, d_head 128), TFLOP/s of the forward and of the backward
  (FLOPs 4·B·H·S²·d forward, 2.5x that backward, halved when causal);
- linear + cross-entropy (8,192 tokens, d 4,096, vocab 128,256): plain (logits, then
  F.cross_entropy), the PyTorch chunked path lmforge.kernels.linear_cross_entropy, the Triton
  kernel and Liger-Kernel's LigerFusedLinearCrossEntropyLoss (bench extra): forward+backward
  time and peak memory above the inputs;
- RMSNorm forward+backward: Triton vs torch.compile'd lmforge.model.layers.RMSNorm (and eager);
- matmul: the tiled, autotuned Triton matmul vs torch.matmul (cuBLAS), TFLOP/s.
Times are triton.testing.do_bench medians (L2 flushed between runs). A Triton kernel's first
call per shape compiles and autotunes; that happens in the warm-up, outside the times.

On a CPU (no GPU) it runs the PyTorch paths only, small and fp32, one thread: the PyTorch FA2
(lmforge.kernels.flash_attention) vs SDPA, chunked vs plain linear + cross-entropy (peak
memory replayed from torch.profiler as bench_attention.py does), RMSNorm eager vs compiled
(not with --quick, whose point is to finish in well under a minute for CI). Times there are
medians of wall time over --reps. Prints one table per section; writes
benchmarks/results/kernels.json (GPU) or kernels_cpu.json (CPU); --quick (smaller sizes)
writes to the temp folder instead, so a smoke test never replaces real numbers.

    python benchmarks/bench_kernels.py [--quick] [--reps 5]
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from lmforge.atomic import write_json
from lmforge.kernels.flash_attention import flash_attention as torch_flash_attention
from lmforge.model.layers import RMSNorm

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Sizes:
    seqs: tuple[int, ...]  # attention sequence lengths
    tokens_per_batch: int  # attention: batch = tokens_per_batch // seq
    heads: int
    d_head: int
    ce: tuple[int, int, int]  # tokens, d, vocab
    norm_rows: int
    norm_dims: tuple[int, ...]
    matmuls: tuple[tuple[int, int, int], ...]  # M, K, N


GPU = Sizes((1024, 2048, 4096, 8192, 16384), 16384, 16, 128, (8192, 4096, 128256), 16384,
            (4096, 8192), ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 14336),
                           (4095, 4097, 4099)))  # fmt: skip
GPU_QUICK = Sizes((1024, 4096), 8192, 16, 128, (4096, 4096, 32768), 8192, (4096,),
                  ((4096, 4096, 4096),))  # fmt: skip
CPU = Sizes((512, 1024), 1024, 4, 64, (4096, 512, 32768), 4096, (512, 2048), ())
CPU_QUICK = Sizes((256,), 256, 4, 64, (1024, 128, 16384), 1024, (512,), ())


def bench_sizes(gpu: bool, quick: bool) -> Sizes:
    return (GPU_QUICK if quick else GPU) if gpu else (CPU_QUICK if quick else CPU)


class Clock:
    """Median milliseconds of a call: triton.testing.do_bench on a GPU, wall time on a CPU."""

    def __init__(self, gpu: bool, reps: int) -> None:
        self.gpu, self.reps = gpu, reps

    def ms(self, fn: Callable[[], object], grad_to_none: list | None = None) -> float:
        if self.gpu:
            from triton.testing import do_bench

            return do_bench(fn, grad_to_none=grad_to_none, warmup=25, rep=100)
        fn()  # warm-up
        times = []
        for _ in range(self.reps):
            for t in grad_to_none or ():
                t.grad = None
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    def peak_mb(self, fn: Callable[[], object]) -> float:
        """Peak memory `fn` allocated above what existed before it, in MB."""
        if self.gpu:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - base) / 1e6
        from bench_attention import peak_bytes

        return peak_bytes(fn) / 1e6


def triton_kernel(name: str, device: torch.device, dtype: torch.dtype):
    """The Triton kernel module, or the reason it cannot run here."""
    from lmforge.kernels.triton import load, unavailable

    reason = unavailable(name, device, dtype)
    return (None, reason) if reason else (load(name), None)


def fwd_bwd(clock: Clock, fn: Callable, inputs: list[torch.Tensor], dout) -> tuple[float, float]:
    """Forward time (no graph kept) and backward time (one graph, replayed) of fn(*inputs)."""
    with torch.no_grad():
        fwd = clock.ms(lambda: fn(*inputs))
    out = fn(*inputs)
    bwd = clock.ms(lambda: out.backward(dout, retain_graph=True), grad_to_none=inputs)
    return fwd, bwd


def bench_attention(clock: Clock, sizes: Sizes, device, dtype) -> list[dict]:
    sides: dict[str, Callable | str] = {}
    if clock.gpu:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        fa, reason = triton_kernel("flash_attention", device, dtype)
        sides["triton fa2"] = reason or fa.flash_attention

        def sdpa_flash(q, k, v, is_causal):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

        sides["sdpa flash"] = sdpa_flash
    else:
        sides["torch fa2"] = torch_flash_attention
        sides["sdpa"] = lambda q, k, v, is_causal: F.scaled_dot_product_attention(
            q, k, v, is_causal=is_causal
        )
    reference = "sdpa flash" if clock.gpu else "sdpa"
    rows = []
    for causal in (True, False):
        for seq in sizes.seqs:
            batch = max(1, sizes.tokens_per_batch // seq)
            g = torch.Generator(device).manual_seed(0)
            shape = (batch, sizes.heads, seq, sizes.d_head)
            q, k, v, dout = (
                torch.randn(shape, generator=g, device=device, dtype=dtype) for _ in range(4)
            )
            inputs = [t.requires_grad_() for t in (q, k, v)]
            flops = 4 * batch * sizes.heads * seq * seq * sizes.d_head * (0.5 if causal else 1)
            want = sides[reference](q, k, v, causal).detach()

            def measure(fn, inputs=inputs, dout=dout, want=want, flops=flops, causal=causal):
                attend = functools.partial(fn, is_causal=causal)
                diff = (attend(*inputs).detach().float() - want.float()).abs().max().item()
                fwd, bwd = fwd_bwd(clock, attend, inputs, dout)
                return {"fwd_ms": fwd, "bwd_ms": bwd, "max_abs_diff": diff,
                        "fwd_tflops": flops / fwd / 1e9,
                        "bwd_tflops": 2.5 * flops / bwd / 1e9}  # fmt: skip

            for name, fn in sides.items():
                row = {"causal": causal, "seq": seq, "batch": batch, "side": name}
                rows.append(measured(row, fn, measure))
    ratios(rows, reference, ("causal", "seq"), "fwd_ms", "bwd_ms")
    return rows


def bench_linear_ce(clock: Clock, sizes: Sizes, device, dtype) -> list[dict]:
    tokens, d, vocab = sizes.ce
    g = torch.Generator(device).manual_seed(0)
    x = torch.randn(tokens, d, generator=g, device=device, dtype=dtype).requires_grad_()
    weight = torch.randn(vocab, d, generator=g, device=device, dtype=dtype) * d**-0.5
    weight.requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=g, device=device)
    sides: dict[str, Callable | str] = {
        "plain": lambda: F.cross_entropy((x @ weight.T).float(), targets),
    }
    try:
        from lmforge.kernels.linear_cross_entropy import linear_cross_entropy

        sides["torch chunked"] = lambda: linear_cross_entropy(x, weight, targets)
    except ImportError as e:
        sides["torch chunked"] = f"lmforge.kernels.linear_cross_entropy missing: {e}"
    if clock.gpu:
        ce, reason = triton_kernel("linear_cross_entropy", device, dtype)
        sides["triton"] = reason or (lambda: ce.linear_cross_entropy(x, weight, targets))
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            liger = LigerFusedLinearCrossEntropyLoss()
            sides["liger"] = lambda: liger(weight, x, targets)
        except ImportError as e:
            sides["liger"] = f"liger-kernel not installed (pip install 'lmforge[bench]'): {e}"
    want = sides["plain"]().item()

    def measure(fn):
        step = lambda: fn().backward()  # noqa: E731
        loss_diff = abs(fn().item() - want)
        ms = clock.ms(step, grad_to_none=[x, weight])
        return {"fwd_bwd_ms": ms, "peak_mb": clock.peak_mb(step), "loss_diff": loss_diff}

    row = {"tokens": tokens, "d": d, "vocab": vocab}
    rows = [measured({**row, "side": name}, fn, measure) for name, fn in sides.items()]
    ratios(rows, "plain", ("tokens",), "fwd_bwd_ms", "peak_mb")
    return rows


def bench_rmsnorm(clock: Clock, sizes: Sizes, device, dtype, compile_: bool) -> list[dict]:
    rms, reason = triton_kernel("rmsnorm", device, dtype) if clock.gpu else (None, None)
    rows = []
    for dim in sizes.norm_dims:
        norm = RMSNorm(dim).to(device)
        g = torch.Generator(device).manual_seed(0)
        x = torch.randn(sizes.norm_rows, dim, generator=g, device=device, dtype=dtype)
        x.requires_grad_()
        dout = torch.randn_like(x)
        sides: dict[str, Callable | str] = {"eager": norm}
        if compile_:
            sides["compiled"] = torch.compile(norm)
        if clock.gpu:
            sides["triton"] = reason or (
                lambda x, w=norm.weight, eps=norm.eps: rms.rms_norm(x, w, eps)
            )
        moved = 5 * x.numel() * x.element_size()  # read x, write y; read x and dy, write dx

        def measure(fn, x=x, dout=dout, weight=norm.weight, moved=moved):
            ms = clock.ms(lambda: fn(x).backward(dout), grad_to_none=[x, weight])
            return {"fwd_bwd_ms": ms, "gb_per_s": moved / ms / 1e6}

        for name, fn in sides.items():
            rows.append(measured({"rows": sizes.norm_rows, "dim": dim, "side": name}, fn, measure))
    reference = "compiled" if compile_ else "eager"
    ratios(rows, reference, ("dim",), "fwd_bwd_ms")
    return rows


def bench_matmul(clock: Clock, sizes: Sizes, device, dtype) -> list[dict]:
    mm, reason = triton_kernel("matmul", device, dtype)
    rows = []
    for m, k, n in sizes.matmuls:
        g = torch.Generator(device).manual_seed(0)
        a = torch.randn(m, k, generator=g, device=device, dtype=dtype)
        b = torch.randn(k, n, generator=g, device=device, dtype=dtype)
        want = torch.matmul(a, b)
        sides = {"cublas": torch.matmul, "triton": reason or mm.matmul}

        def measure(fn, a=a, b=b, want=want, flops=2 * m * k * n):
            rel = ((fn(a, b) - want).float().norm() / want.float().norm()).item()
            ms = clock.ms(lambda: fn(a, b))
            return {"ms": ms, "tflops": flops / ms / 1e9, "rel_err": rel}

        for name, fn in sides.items():
            rows.append(measured({"m": m, "k": k, "n": n, "side": name}, fn, measure))
    ratios(rows, "cublas", ("m", "k", "n"), "ms")
    return rows


def measured(row: dict, side: Callable | str, measure: Callable[[Callable], dict]) -> dict:
    """The row with what measure(side) reports, or a note: why the side cannot run here, or,
    on a GPU (where one failing side should not cost the others' numbers), why it failed."""
    if isinstance(side, str):
        return {**row, "note": side}
    try:
        return {**row, **measure(side)}
    except Exception as e:
        if not torch.cuda.is_available():
            raise
        traceback.print_exc()
        return {**row, "note": f"failed: {type(e).__name__}: {e}"}


def ratios(rows: list[dict], reference: str, keys: tuple[str, ...], *metrics: str) -> None:
    """Each row's metric over its reference side's, for rows that agree on `keys`."""
    refs = {tuple(r[k] for k in keys): r for r in rows if r["side"] == reference}
    for r in rows:
        ref = refs.get(tuple(r[k] for k in keys))
        for metric in metrics:
            if ref and metric in r and ref.get(metric):
                r[f"{metric}_vs_{reference.replace(' ', '_')}"] = r[metric] / ref[metric]


def print_table(title: str, rows: list[dict]) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r if k != "note"))
    print(f"\n{title}")
    print("| " + " | ".join(columns) + " | note |")
    print("|" + "---|" * (len(columns) + 1))
    for r in rows:
        cells = [_cell(r.get(c)) for c in columns]
        print("| " + " | ".join(cells) + f" | {r.get('note', '')} |")


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--reps", type=int, default=5, help="CPU: timed repetitions")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    if not gpu:
        torch.set_num_threads(1)
    sizes = bench_sizes(gpu, args.quick)
    clock = Clock(gpu, args.reps)
    started = time.perf_counter()
    machine = torch.cuda.get_device_name() if gpu else platform.processor() or platform.machine()
    out = {
        "machine": machine,
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "quick": args.quick,
        "sizes": asdict(sizes),
        "time": "triton.testing.do_bench median ms" if gpu else f"median wall ms of {args.reps}",
    }
    if gpu:
        import triton

        out["triton"] = triton.__version__
    else:
        out["threads"] = torch.get_num_threads()
    sections = {
        "attention": lambda: bench_attention(clock, sizes, device, dtype),
        "linear_cross_entropy": lambda: bench_linear_ce(clock, sizes, device, dtype),
        "rmsnorm": lambda: bench_rmsnorm(clock, sizes, device, dtype, gpu or not args.quick),
    }
    if gpu:
        sections["matmul"] = lambda: bench_matmul(clock, sizes, device, dtype)
    print(f"kernels on {machine}, {out['dtype']}{' (quick)' if args.quick else ''}")
    for name, run in sections.items():
        section_start = time.perf_counter()
        out[name] = rows = run()
        print_table(f"{name} ({time.perf_counter() - section_start:.0f} s)", rows)
    out["total_s"] = time.perf_counter() - started
    print(f"\ntotal {out['total_s']:.0f} s")
    path = RESULTS / ("kernels.json" if gpu else "kernels_cpu.json")
    if args.quick:
        path = Path(tempfile.gettempdir()) / path.name.replace(".json", "_quick.json")
    write_json(path, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
