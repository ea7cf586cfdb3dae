"""Attention forward+backward on the CPU: FlashAttention-2 (PyTorch) against the materialised
softmax and SDPA, peak memory and time, one run.

Shape: batch 1, 4 heads, seq 4096, d_head 64, fp32, causal (`--quick`: seq 512). Variants:
- fa2 bN: lmforge.kernels.flash_attention with block_q = block_k = N (64, 128, 256);
- materialised: q @ kᵀ * scale, causal mask, softmax, @ v, in plain torch (autograd keeps the
  seq x seq probabilities);
- sdpa: torch.nn.functional.scaled_dot_product_attention(is_causal=True), its default CPU
  backend.

Peak memory: forward and backward run once under torch.profiler with profile_memory=True,
which records every allocation and free of the CPU allocator (the tensors of every op,
kernels' internal buffers included), each with its address and order. Replaying them in order
gives the bytes live at each moment; the peak counts only what the step allocated (q, k, v and
dout exist before it). Time: CPU time of the calling thread (torch at one thread, so every op
and the backward run on it: other processes on a shared machine do not inflate it), median of
interleaved repetitions; wall time beside it. Targets: FA2's peak ≤ 1/8 of the materialised
one; FA2's time ≤ 2x SDPA's (the fastest FA2 block size). Writes
benchmarks/results/attention.json (`--quick`: attention_quick.json in the temp folder).

    python benchmarks/bench_attention.py [--reps 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from lmforge.atomic import write_json
from lmforge.device.peak import processor_name
from lmforge.kernels.flash_attention import flash_attention

RESULTS = Path(__file__).parent / "results"
BATCH, HEADS, D_HEAD = 1, 4, 64
BLOCKS = (64, 128, 256)
MEMORY_TARGET, TIME_TARGET = 1 / 8, 2.0


def materialised(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(q.shape[-1]))
    causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v


def variants() -> dict[str, Callable]:
    out = {
        f"fa2 b{b}": lambda q, k, v, b=b: flash_attention(q, k, v, True, block_q=b, block_k=b)
        for b in BLOCKS
    }
    out["materialised"] = materialised
    out["sdpa"] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out


def step(attend: Callable, inputs: list[torch.Tensor], dout: torch.Tensor) -> torch.Tensor:
    """Forward and backward once (the gradients land in `inputs`); the output, detached."""
    for t in inputs:
        t.grad = None
    out = attend(*inputs)
    out.backward(dout)
    return out.detach()


def results(out: torch.Tensor, inputs: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([out.flatten(), *(t.grad.flatten() for t in inputs)])


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes the CPU allocator held for `fn`'s own allocations (see the docstring)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    memory = sorted(
        (e["args"] for e in events if e.get("name") == "[memory]"), key=lambda a: a["Ev Idx"]
    )
    live, peak, held = 0, 0, {}
    for a in memory:
        if a["Bytes"] > 0:
            held[a["Addr"]] = a["Bytes"]
            live += a["Bytes"]
            peak = max(peak, live)
        else:
            live -= held.pop(a["Addr"], 0)  # frees of memory from before the step: not ours
    return peak


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    cpu, wall = time.thread_time(), time.perf_counter()
    fn()
    return time.thread_time() - cpu, time.perf_counter() - wall


def bench(seq: int, reps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    inputs = [
        torch.randn(BATCH, HEADS, seq, D_HEAD, generator=g).requires_grad_() for _ in range(3)
    ]
    dout = torch.randn(BATCH, HEADS, seq, D_HEAD, generator=g)
    runs = {name: (lambda a=attend: step(a, inputs, dout)) for name, attend in variants().items()}
    reference = results(runs["sdpa"](), inputs)
    result = {}
    for name, run in runs.items():  # warm-up, agreement with SDPA, then memory
        diff = (results(run(), inputs) - reference).abs().max().item()
        result[name] = {"max_abs_diff_vs_sdpa": diff}
        result[name]["peak_bytes"] = peak_bytes(run)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            samples[name].append(timed(run))
    for name, times in samples.items():
        result[name]["cpu_s"] = statistics.median(t[0] for t in times)
        result[name]["wall_s"] = statistics.median(t[1] for t in times)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="seq 512, for a smoke test")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seq = 512 if args.quick else 4096
    shape = {"batch": BATCH, "heads": HEADS, "seq": seq, "d_head": D_HEAD, "dtype": "float32"}
    out = {
        "machine": processor_name(torch.device("cpu")),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "shape": {**shape, "causal": True},
        "memory": "peak of the CPU allocator's live bytes during forward+backward, replayed "
        "from torch.profiler(profile_memory=True) allocation events",
        "time": f"median CPU time of the calling thread over {args.reps} interleaved reps",
    }
    out["variants"] = r = bench(seq, args.reps)
    print(f"attention fwd+bwd, {shape}, causal, {out['threads']} thread, {out['machine']}")
    print("| variant | peak MB | x materialised | CPU s | x sdpa | wall s | max |Δ| vs sdpa |")
    print("|---|---|---|---|---|---|---|")
    for name, m in r.items():
        m["memory_vs_materialised"] = m["peak_bytes"] / r["materialised"]["peak_bytes"]
        m["time_vs_sdpa"] = m["cpu_s"] / r["sdpa"]["cpu_s"]
        print(
            f"| {name} | {m['peak_bytes'] / 1e6:.1f} | {m['memory_vs_materialised']:.3f} | "
            f"{m['cpu_s']:.3f} | {m['time_vs_sdpa']:.2f} | {m['wall_s']:.3f} | "
            f"{m['max_abs_diff_vs_sdpa']:.1e} |"
        )
    best = min((name for name in r if name.startswith("fa2")), key=lambda n: r[n]["cpu_s"])
    memory, speed = r[best]["memory_vs_materialised"], r[best]["time_vs_sdpa"]
    out["targets"] = {
        "fastest_fa2": best,
        "memory_vs_materialised": {
            "ratio": memory,
            "target": MEMORY_TARGET,
            "met": memory <= MEMORY_TARGET,
        },
        "time_vs_sdpa": {"ratio": speed, "target": TIME_TARGET, "met": speed <= TIME_TARGET},
    }
    print(
        f"target memory ({best}): {memory:.3f} of materialised (≤ {MEMORY_TARGET:.3f}: "
        f"{memory <= MEMORY_TARGET}); target time: {speed:.2f}x sdpa (≤ {TIME_TARGET}x: "
        f"{speed <= TIME_TARGET})"
    )
    path = RESULTS / "attention.json"
    if args.quick:  # a smoke test's numbers never replace the real ones
        path = Path(tempfile.gettempdir()) / "attention_quick.json"
    write_json(path, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
