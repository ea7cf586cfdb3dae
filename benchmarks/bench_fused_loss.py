"""Fused linear + cross-entropy against the plain path: peak memory and time of forward+backward.

Sides, on identical inputs (x: tokens × d, weight: vocab × d, both requiring grad):
- plain: `F.cross_entropy(x @ weight.T, targets)`, then backward (the (tokens × vocab) logits,
  their log-softmax and its gradient all exist);
- fused: lmforge.kernels.linear_cross_entropy (token chunks, the logit gradient taken in the
  forward), the default chunk size unless --chunks lists others (the
  first is the one held to the targets);
- Liger-Kernel's LigerFusedLinearCrossEntropyLoss: Triton only, so on CPU it is skipped with a
  note (on CUDA it runs when `liger-kernel` is installed).

Peak memory, two ways, each side alone:
- live tensor bytes: a TorchDispatchMode sees every tensor each op creates during one
  forward+backward (views, in-place and out= results excluded) and follows its storage until
  it is freed (PyTorch keeps a storage's Python object alive exactly as long as the storage,
  autograd's saved copies included); the peak of the sum, inputs excluded, gradients
  included. On CUDA: torch.cuda.max_memory_allocated.
- process RSS: each side runs in a fresh subprocess; its peak RSS (VmHWM, reset through
  /proc/self/clear_refs once the inputs exist) during one forward+backward, minus the RSS
  before it (what the OS saw, allocator slack included; Linux only).
Time: wall-clock of forward+backward (threads as torch sets them), sides interleaved, one
warm-up each, median of --reps; the median CPU time is printed too, since the machine may be
shared. glibc keeps freed memory (lmforge.train.compose.keep_freed_memory), as in training.
Targets (issue 21): plain peak / fused peak >= 4, fused time / plain time <= 1.2.
Writes benchmarks/results/fused_loss.json (--quick: fused_loss_quick.json).

    python benchmarks/bench_fused_loss.py [--quick] [--reps 5] [--chunks 256,128,512]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lmforge.atomic import write_json
from lmforge.kernels.linear_cross_entropy import default_chunk_size, linear_cross_entropy
from lmforge.train.compose import keep_freed_memory

RESULTS = Path(__file__).parent / "results" / "fused_loss.json"  # --quick: fused_loss_quick.json
FULL = {"tokens": 8192, "vocab": 32768, "d": 512}
QUICK = {"tokens": 2048, "vocab": 16384, "d": 256}
TARGETS = {"memory_ratio": 4.0, "time_ratio": 1.2}


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of the storages that ops under this mode create, while each is alive."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}  # storage address: bytes
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(r.alias_info is not None for r in func._schema.returns):
            return out  # a view, in-place or out= result: no new storage
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._follow(t.untyped_storage())
        return out

    def _follow(self, storage: torch.UntypedStorage) -> None:
        key = storage.data_ptr()
        if key == 0 or key in self.live:
            return
        self.live[key] = storage.nbytes()
        self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)
        # a storage's Python object lives exactly as long as the storage (PyTorch keeps it)
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        self.now -= self.live.pop(key)


def make_inputs(tokens: int, vocab: int, d: int, device: str):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, d, generator=g).to(device).requires_grad_()
    weight = (torch.randn(vocab, d, generator=g) * d**-0.5).to(device).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=g).to(device)
    return x, weight, targets


def liger_loss():
    """Liger-Kernel's fused loss module, or the reason it cannot run here."""
    if not torch.cuda.is_available():
        return None, "Liger-Kernel is Triton-only (GPU): skipped on CPU"
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except Exception as e:  # a bench-only extra: say why the row is missing
        return None, f"Liger-Kernel not importable: {type(e).__name__}: {e}"
    return LigerFusedLinearCrossEntropyLoss(), None


def side(name: str, chunk: int | None):
    """The forward+backward of one side, as a function of (x, weight, targets)."""
    if name == "plain":
        return lambda x, w, t: F.cross_entropy(x @ w.T, t).backward()
    if name == "fused":
        return lambda x, w, t: linear_cross_entropy(x, w, t, chunk_size=chunk).backward()
    loss, why = liger_loss()
    if loss is None:
        raise RuntimeError(why)
    return lambda x, w, t: loss(w, x, t).backward()


def run_once(fn, x, w, t) -> None:
    x.grad = w.grad = None
    fn(x, w, t)
    if x.device.type == "cuda":
        torch.cuda.synchronize()


def live_peak(fn, x, w, t) -> int:
    if x.device.type == "cuda":
        x.grad = w.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run_once(fn, x, w, t)
        return torch.cuda.max_memory_allocated() - base
    x.grad = w.grad = None
    with LiveTensorBytes() as mode:
        fn(x, w, t)
        x.grad = w.grad = None  # gradients were counted; let them go inside the mode
    return mode.peak


def rss_peak(name: str, chunk: int | None, size: dict, device: str) -> int | None:
    """Extra peak RSS of one forward+backward, in a fresh process (CPU only)."""
    if device != "cpu":
        return None
    cmd = [sys.executable, __file__, "--child", name, "--device", device]
    cmd += ["--size", json.dumps(size)] + (["--chunks", str(chunk)] if chunk else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["rss_peak_bytes"]


def peak_rss_since_reset() -> int:
    """Bytes: the process's peak RSS since the last reset (Linux's VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(name: str, chunk: int | None, size: dict, device: str) -> None:
    keep_freed_memory()
    x, w, t = make_inputs(size["tokens"], size["vocab"], size["d"], device)
    fn = side(name, chunk)
    current = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # fallback: no reset
    try:
        Path("/proc/self/clear_refs").write_text("5")  # the peak RSS restarts from now
        current = peak_rss_since_reset()
    except OSError:
        pass
    run_once(fn, x, w, t)
    print(json.dumps({"rss_peak_bytes": peak_rss_since_reset() - current}))


def timings(fns: dict, x, w, t, reps: int) -> dict[str, dict[str, float]]:
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for fn in fns.values():
        run_once(fn, x, w, t)  # warm-up
    for _ in range(reps):
        for label, fn in fns.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            run_once(fn, x, w, t)
            wall[label].append(time.perf_counter() - start)
            cpu[label].append(time.process_time() - start_cpu)
    return {
        k: {"time_s": statistics.median(wall[k]), "cpu_s": statistics.median(cpu[k])} for k in fns
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"small sizes: {QUICK}")
    parser.add_argument("--reps", type=int, help="timed repetitions (5; --quick: 3)")
    parser.add_argument("--chunks", help="fused chunk sizes to compare, e.g. 128,256,512")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")] if args.chunks else [None]
    if args.child:
        child(args.child, chunks[0], json.loads(args.size), args.device)
        return
    keep_freed_memory()
    size = QUICK if args.quick else FULL
    args.reps = args.reps or (3 if args.quick else 5)
    default = default_chunk_size(size["vocab"])
    sides: dict[str, tuple[str, int | None]] = {"plain": ("plain", None)}
    for c in chunks:
        sides[f"fused chunk {c or default}"] = ("fused", c)
    notes = []
    _, why = liger_loss()
    if why is None:
        sides["liger"] = ("liger", None)
    else:
        notes.append(why)
        print(why)
    x, w, t = make_inputs(size["tokens"], size["vocab"], size["d"], args.device)
    fns = {label: side(name, c) for label, (name, c) in sides.items()}
    rows = timings(fns, x, w, t, args.reps)
    for label, (name, c) in sides.items():
        rows[label]["live_peak_bytes"] = live_peak(fns[label], x, w, t)
        rows[label]["rss_peak_bytes"] = rss_peak(name, c, size, args.device)
    plain = rows["plain"]
    print(f"{size}, device {args.device}, {torch.get_num_threads()} threads, reps {args.reps}")
    print("| side | live peak MiB | ×plain | RSS peak MiB | time s | ×plain | CPU s |")
    print("|---|---|---|---|---|---|---|")
    for label, r in rows.items():
        r["memory_ratio"] = plain["live_peak_bytes"] / r["live_peak_bytes"]
        r["time_ratio"] = r["time_s"] / plain["time_s"]
        rss = "-" if r["rss_peak_bytes"] is None else f"{r['rss_peak_bytes'] / 2**20:.0f}"
        print(
            f"| {label} | {r['live_peak_bytes'] / 2**20:.0f} | {1 / r['memory_ratio']:.3f} | "
            f"{rss} | {r['time_s']:.2f} | {r['time_ratio']:.2f} | {r['cpu_s']:.2f} |"
        )
    fused = rows[f"fused chunk {chunks[0] or default}"]
    targets = {
        "memory_ratio": {
            "value": fused["memory_ratio"],
            "target": f">= {TARGETS['memory_ratio']}",
            "met": fused["memory_ratio"] >= TARGETS["memory_ratio"],
        },
        "time_ratio": {
            "value": fused["time_ratio"],
            "target": f"<= {TARGETS['time_ratio']}",
            "met": fused["time_ratio"] <= TARGETS["time_ratio"],
        },
    }
    for key, v in targets.items():
        print(f"target {key}: {v['value']:.2f} ({v['target']}: {v['met']})")
    out = {
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "size": size,
        "quick": args.quick,
        "reps": args.reps,
        "default_chunk": default,
        "sides": rows,
        "targets": targets,
        "notes": notes,
    }
    path = RESULTS.with_name("fused_loss_quick.json") if args.quick else RESULTS
    write_json(path, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
