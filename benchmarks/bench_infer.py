"""Inference speed: lmforge's engine against transformers' generate, side by side in one run.

Both sides hold identical weights (lmforge's model exported with `to_hf_state_dict` into
transformers' LlamaForCausalLM, sdpa attention, its default dynamic KV cache), run one CPU
thread, decode greedily and are timed in interleaved repetitions (medians reported). Times
are CPU seconds of the thread doing the work (transformers: the caller's; lmforge: its
scheduler thread's), so other load on a shared machine does not count against either side:

- prefill: tokens/s of a 512-token prompt (time to the first token);
- decode: generated tokens/s at batch 1 (after that 512-token prompt) and at batch 8 (after
  512-token prompts for the small model, 128 for the large one, whose batched prefill would
  otherwise dominate the run), from the second decode step (all prompts prefilled) to the last;
- the matrix-vector floor: the bytes of weights a decode step reads (everything but the
  embedding table) over this machine's matrix-vector bandwidth in that dtype. Two floors: at
  the bandwidth of F.linear over about 440 MB of weights as nn.Linear stores them (row-major),
  the issue's definition; and at the best of the row-major, column-major, oneDNN-packed and
  compiled streamed layouts' bandwidths (lmforge.infer.weight_layouts), the hardware's.

Models: small (vocab 8192, d_model 256, 4 layers) and large (vocab 32000, d_model 768, 12
layers), in fp32 and bf16. lmforge runs eager, with its compiled decode step, and compiled
with its weights re-laid for the batch size (`relayout_weights=True`, as `lmforge serve`,
`chat` and `generate` run): batch 1 then runs in a one-slot engine (as `lmforge chat` and
single-prompt `generate --compile`), batch 8 in an eight-slot one (as `lmforge serve`); both
take lmforge's decode kernels on an x86-64 CPU with AVX2 or AVX-512 where they are built
(results recorded before them ran the others), elsewhere the streamed layout at batch 1 and
oneDNN-packed weights at 8.
Writes benchmarks/results/infer.json.

    python benchmarks/bench_infer.py [--reps 3] [--only small] [--dtypes fp32,bf16]
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Inductor's pool of compile workers would otherwise share the memory bus with the timed runs.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch

from lmforge.atomic import write_json
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.weight_layouts import PackedLinear, StreamedLinear
from lmforge.model import ModelConfig, Transformer
from lmforge.model.hf import hf_config, to_hf_state_dict
from lmforge.model.layers import Linear

RESULTS = Path(__file__).parent / "results" / "infer.json"
PREFILL_LEN, BATCH = 512, 8
MODELS = {  # config, decode steps, prompt tokens at batch 8
    "small": (ModelConfig(vocab_size=8192, d_model=256, n_layers=4, n_heads=4), 64, 512),
    "large": (ModelConfig(vocab_size=32000, d_model=768, n_layers=12, n_heads=12), 32, 128),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class NoSpecials:
    """The engine's tokenizer interface, with no stop tokens: every run decodes to length."""

    special_tokens: dict[str, int] = {}  # noqa: RUF012

    def token_bytes(self, token: int) -> bytes:
        return b"x"


def lmforge_run(engine: Engine, prompts: list[list[int]], n: int) -> list[float]:
    """The scheduler thread's CPU clock at submission and as each step's tokens arrive."""
    engine.submit([0], SamplingParams(max_tokens=1)).result()  # the thread is running
    assert engine._thread is not None and engine._thread.ident is not None
    cpu = time.pthread_getcpuclockid(engine._thread.ident)
    start = time.clock_gettime(cpu)
    handles = [engine.submit(p, SamplingParams(max_tokens=n, temperature=0)) for p in prompts]
    times = [time.clock_gettime(cpu) for _ in handles[0]]
    for h in handles[1:]:
        h.result()
    return [start, *times]


def hf_run(model, prompts: list[list[int]], n: int) -> list[float]:
    from transformers import LogitsProcessor, LogitsProcessorList

    class Clock(LogitsProcessor):  # called once per step, after that step's forward
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            self.times.append(time.thread_time())
            return scores

    clock = Clock()
    ids = torch.tensor(prompts)
    start = time.thread_time()
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            logits_processor=LogitsProcessorList([clock]),
        )
    return [start, *clock.times]


def rates(times: list[float], batch: int, prompt_len: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) from [start, step 1, step 2, ...] times."""
    prefill = prompt_len * batch / (times[1] - times[0])
    decode = batch * (len(times) - 3) / (times[-1] - times[2])
    return prefill, decode


LAYOUTS = ("row_major", "column_major", "packed", "streamed")


def matvec_bandwidth(
    dtype: torch.dtype, layout: str, n_bytes: int = 440_000_000, reps: int = 7
) -> float:
    """Bytes/s of y = W x over a weight matrix of about n_bytes (well past the caches), with W
    stored row-major (nn.Linear's layout), column-major, packed by oneDNN for one row, or
    row-major and compiled as a multiply and a sum (StreamedLinear)."""
    d = 768
    w = torch.randn(n_bytes // (d * 4), d).to(dtype)
    n_read = w.numel() * w.element_size()
    linear = Linear(d, w.shape[0])
    linear.weight.data = w
    if layout == "column_major":
        linear.weight.data = w.t().contiguous().t()
    elif layout == "packed":
        linear = PackedLinear(linear, batch_size=1)
    elif layout == "streamed":
        linear = torch.compile(StreamedLinear(linear), dynamic=False)
    x = torch.randn(1, d).to(dtype)
    times = []
    with torch.inference_mode():
        for _ in range(2):  # warm up (the streamed layout compiles here)
            linear(x)
        for _ in range(reps):
            t = time.thread_time()
            linear(x)
            times.append(time.thread_time() - t)
    return n_read / statistics.median(times)


def bench_model(name: str, dtype_name: str, reps: int, bandwidth: dict[str, float]) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    config, n, batch_len = MODELS[name]
    config.max_seq_len = 1024
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    model = Transformer(config).to(dtype).eval()
    fields = {
        k: v for k, v in hf_config(config).items() if k not in ("architectures", "model_type")
    }
    hf = LlamaForCausalLM(LlamaConfig(**fields, attn_implementation="sdpa")).to(dtype).eval()
    hf.load_state_dict(to_hf_state_dict(model))
    weight_bytes = sum(
        p.numel() * p.element_size() for k, p in model.named_parameters() if "tok_emb" not in k
    )
    g = torch.Generator().manual_seed(1)
    long = [torch.randint(0, config.vocab_size, (PREFILL_LEN,), generator=g).tolist()]
    batch = torch.randint(0, config.vocab_size, (BATCH, batch_len), generator=g).tolist()

    def engine(slots: int, **options) -> Engine:  # an owned copy: relayout changes the model
        return Engine(copy.deepcopy(model), NoSpecials(), max_batch_size=slots, **options)

    engines = {  # label: (the engine for one prompt, the engine for a batch of 8)
        "lmforge": (engine(BATCH),) * 2,
        "lmforge compiled": (engine(BATCH, compile=True),) * 2,
        "lmforge compiled, relaid": (
            engine(1, compile=True, relayout_weights=True),
            engine(BATCH, compile=True, relayout_weights=True),
        ),
    }
    impls = {"transformers": (lambda p, k: hf_run(hf, p, k),) * 2}
    for label, pair in engines.items():
        impls[label] = tuple(lambda p, k, e=e: lmforge_run(e, p, k) for e in pair)
    samples: dict[str, dict[str, list[float]]] = {k: {} for k in impls}
    check = {}
    for one, many in impls.values():  # warm up at the shapes timed: compiled steps compile here
        one(long, 3)
        many(batch, 3)
    for _ in range(reps):  # interleaved: every implementation once per round
        for label, (one, many) in impls.items():
            prefill, decode1 = rates(one(long, n), 1, PREFILL_LEN)
            _, decode8 = rates(many(batch, n), BATCH, batch_len)
            measured = {"prefill": prefill, "decode_b1": decode1, "decode_b8": decode8}
            for key, value in measured.items():
                samples[label].setdefault(key, []).append(value)
    greedy = SamplingParams(max_tokens=8, temperature=0)
    for label, pair in engines.items():  # identical weights, identical greedy tokens
        check[label] = [e.generate(long, greedy)[0].token_ids for e in dict.fromkeys(pair)]
        for e in pair:
            e.close()
    with torch.inference_mode():
        ref = hf.generate(torch.tensor(long), max_new_tokens=8, do_sample=False, pad_token_id=0)
    same = {k: all(c == ref[0, PREFILL_LEN:].tolist() for c in cs) for k, cs in check.items()}
    floor_ms = weight_bytes / bandwidth["row_major"] * 1e3
    best_floor_ms = weight_bytes / max(bandwidth.values()) * 1e3
    result = {
        "params": sum(p.numel() for p in model.parameters()),
        "weight_bytes_per_step": weight_bytes,
        "matvec_floor_ms": floor_ms,
        "matvec_floor_best_layout_ms": best_floor_ms,
        "same_greedy_tokens": same,
        "decode_steps": n,
        "batch8_prompt_tokens": batch_len,
    }
    for label, runs in samples.items():
        med = {k: statistics.median(v) for k, v in runs.items()}
        med["decode_b1_ms_per_step"] = 1e3 / med["decode_b1"]
        med["pct_of_floor_b1"] = 100 * floor_ms / med["decode_b1_ms_per_step"]
        med["pct_of_best_floor_b1"] = 100 * best_floor_ms / med["decode_b1_ms_per_step"]
        result[label] = med
    hf_med = result["transformers"]
    for label in engines:
        result[label]["ratio_vs_transformers"] = {
            k: result[label][k] / hf_med[k] for k in ("prefill", "decode_b1", "decode_b8")
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", choices=sorted(MODELS), help="one model size")
    parser.add_argument("--dtypes", default="fp32,bf16")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import transformers

    layouts = {
        k: {layout: matvec_bandwidth(DTYPES[k], layout) for layout in LAYOUTS}
        for k in args.dtypes.split(",")
    }
    out = {
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": 1,
        "matvec_bandwidth_gb_s": {
            k: {layout: v / 1e9 for layout, v in by_layout.items()}
            for k, by_layout in layouts.items()
        },
        "results": {},
    }
    print(f"matrix-vector bandwidth: {out['matvec_bandwidth_gb_s']}")
    head = f"| {'model':<6} | dtype | {'implementation':<16} | prefill tok/s | decode b1 tok/s"
    print(head + " | ms/step | % of floor (best) | decode b8 tok/s |")
    for name in [args.only] if args.only else list(MODELS):
        for dtype_name in args.dtypes.split(","):
            r = bench_model(name, dtype_name, args.reps, layouts[dtype_name])
            out["results"][f"{name}/{dtype_name}"] = r
            for label in [k for k in r if isinstance(r[k], dict) and "prefill" in r[k]]:
                m = r[label]
                ratio = m.get("ratio_vs_transformers")
                x = (
                    ""
                    if ratio is None
                    else " ({:.2f}x, {:.2f}x, {:.2f}x)".format(
                        *(ratio[k] for k in ("prefill", "decode_b1", "decode_b8"))
                    )
                )
                print(
                    f"| {name:<6} | {dtype_name} | {label:<16} | {m['prefill']:13.0f} | "
                    f"{m['decode_b1']:15.1f} | {m['decode_b1_ms_per_step']:7.2f} | "
                    f"{m['pct_of_floor_b1']:5.0f}% ({m['pct_of_best_floor_b1']:3.0f}%) | "
                    f"{m['decode_b8']:15.1f} |{x}"
                )
            floor, best = r["matvec_floor_ms"], r["matvec_floor_best_layout_ms"]
            same = r["same_greedy_tokens"]
            print(
                f"  matvec floor {floor:.2f} ms/step, best layout {best:.2f}; same tokens: {same}"
            )
    write_json(RESULTS, out)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
