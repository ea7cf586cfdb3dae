"""Quantized decode and quality: fp32 against lmforge int8 / int4-g128 and torchao, one run.

Speed: every side is lmforge's engine with a compiled decode step over identical weights, at
batch 1 (a one-slot engine) and batch 8 (eight slots), timed as in bench_infer.py (CPU time of
the scheduler thread, one thread, interleaved repetitions, medians):
- fp32: the weights laid out for the batch as the engine does (lmforge's decode kernels on an
  x86-64 CPU with AVX2 or AVX-512 VNNI, up to 8 rows; elsewhere streamed at batch 1, oneDNN-packed
  at 8);
- lmforge int8 / int4-g128: QuantizedLinear, which reads the codes in the same decode kernels
  (elsewhere: dequantization fused into the streamed loop at batch 1, torch's int8 packed
  kernel or dequantize-then-matmul at batch 8), the float head laid out as fp32's is;
- "+ head": the same with the output head quantized too (`lmforge quantize --quantize-head`, and
  what llama.cpp's q8_0 and q4_0 files hold): the 134M model's fp32 head is 98 MB of the
  183 MB an int8 step reads, and it bounds int4-g128 with a float head at 3.0x fp32 (the
  "planned" column: each step's weight bytes alone, read at one rate);
- torchao: `quantize_(model, Int8WeightOnlyConfig())` on the same float model.
Resident weight bytes are measured from the modules' tensors.

Quality (with --checkpoint): bits per byte on the checkpoint's validation split for the float
model and its int8, int4-g128 RTN, AWQ and GPTQ quantizations and RTN with the head quantized
(calibration: 128 windows of the same split, as `lmforge quantize` takes by default), and each
one's Δ against float.
Writes benchmarks/results/quant.json.

    python benchmarks/bench_quant.py [--reps 3] [--only small|large] [--checkpoint RUN]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch
from bench_infer import NoSpecials, lmforge_run, rates

from lmforge.atomic import write_json
from lmforge.device.capability import cpu_capability
from lmforge.infer.engine import Engine
from lmforge.kernels import cpu_decode
from lmforge.model import ModelConfig, Transformer
from lmforge.plan.inference import quantized_bytes_read, weight_bytes_read
from lmforge.plan.shapes import from_model_config
from lmforge.quant.quantize import quantize_model

RESULTS = Path(__file__).parent / "results" / "quant.json"
BATCH, PROMPT = 8, 128
MODELS = {  # config, decode steps
    "small": (ModelConfig(vocab_size=8192, d_model=256, n_layers=4, n_heads=4), 64),
    "large": (ModelConfig(vocab_size=32000, d_model=768, n_layers=12, n_heads=12), 32),
}
HEAD = " + head"
TARGETS = {("int8", "b1"): 2.0, ("int4-g128", "b1"): 3.0, ("int8", "b8"): 1.3}
TARGETS.update({(label + HEAD, key): target for (label, key), target in TARGETS.items()})


def resident_bytes(model: torch.nn.Module) -> int:
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def variants(model: Transformer) -> dict[str, tuple[Transformer, bool]]:
    """label: (model, relayout_weights)."""
    out = {"fp32": (model, True)}
    for label, scheme, group in (("int8", "int8", None), ("int4-g128", "int4", 128)):
        for head in (False, True):
            q = copy.deepcopy(model)
            quantize_model(q, scheme, group, quantize_head=head)
            out[label + (HEAD if head else "")] = (q, True)
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        ao = copy.deepcopy(model)
        quantize_(ao, Int8WeightOnlyConfig())
        out["torchao int8"] = (ao, False)
    except Exception as e:  # torchao is a bench extra; say why a row is missing
        print(f"torchao int8 skipped: {type(e).__name__}: {e}")
    return out


def bench_speed(name: str, reps: int) -> dict:
    config, steps = MODELS[name]
    config.max_seq_len = 512
    torch.manual_seed(0)
    model = Transformer(config).eval()
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, config.vocab_size, (BATCH, PROMPT), generator=g).tolist()
    engines, result = {}, {}
    for label, (m, relayout) in variants(model).items():
        engines[label] = tuple(
            Engine(
                copy.deepcopy(m),
                NoSpecials(),
                max_batch_size=slots,
                compile=True,
                relayout_weights=relayout,
            )
            for slots in (1, BATCH)
        )
        result[label] = {"resident_weight_bytes": resident_bytes(m)}
    samples: dict[str, dict[str, list[float]]] = {k: {"b1": [], "b8": []} for k in engines}
    for one, many in engines.values():  # warm up: the compiled steps compile here
        lmforge_run(one, prompts[:1], 3)
        lmforge_run(many, prompts, 3)
    for _ in range(reps):
        for label, (one, many) in engines.items():
            samples[label]["b1"].append(rates(lmforge_run(one, prompts[:1], steps), 1, PROMPT)[1])
            samples[label]["b8"].append(rates(lmforge_run(many, prompts, steps), BATCH, PROMPT)[1])
    for label, pair in engines.items():
        for e in pair:
            e.close()
        for key in ("b1", "b8"):
            result[label][f"decode_{key}"] = statistics.median(samples[label][key])
            result[label][f"ratio_{key}"] = result[label][f"decode_{key}"] / statistics.median(
                samples["fp32"][key]
            )
        result[label]["planned_ratio_b1"] = planned_ratio(config, label)
    return result


def planned_ratio(config: ModelConfig, label: str) -> float:
    """The planner's batch-1 speed-up if decode were bound by the weight bytes read alone."""
    shape = from_model_config(label, config)
    fp32 = weight_bytes_read(shape, 1, 4.0)
    head = label.endswith(HEAD)
    if label.startswith("int8"):
        return fp32 / quantized_bytes_read(shape, "int8", quantized_head=head)
    if label.startswith("int4"):
        return fp32 / quantized_bytes_read(shape, "int4", 128, quantized_head=head)
    return 1.0 if label == "fp32" else fp32 / weight_bytes_read(shape, 1, 1.0)


def bench_quality(checkpoint: str) -> dict:
    from lmforge.commands.quant import calibration_ids
    from lmforge.eval.heldout_loss import evaluate_checkpoint
    from lmforge.quant.checkpoint import quantize_checkpoint

    calibration = calibration_ids(checkpoint, None, 128)
    rows = {"fp32": evaluate_checkpoint(checkpoint).result.bpb}
    with tempfile.TemporaryDirectory() as tmp:
        for label, scheme, method, head in (
            ("int8", "int8", "rtn", False),
            ("int4-g128 rtn", "int4", "rtn", False),
            ("int4-g128 awq", "int4", "awq", False),
            ("int4-g128 gptq", "int4", "gptq", False),
            ("int8" + HEAD, "int8", "rtn", True),
            ("int4-g128 rtn" + HEAD, "int4", "rtn", True),
        ):
            folder = Path(tmp) / label.replace(" ", "-")
            out = quantize_checkpoint(checkpoint, folder, scheme, 128, method, calibration, head)
            rows[label] = evaluate_checkpoint(out).result.bpb
    return {k: {"bpb": v, "delta": v - rows["fp32"]} for k, v in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", choices=sorted(MODELS))
    parser.add_argument("--checkpoint", help="a run or checkpoint for the Δbpb table")
    parser.add_argument(
        "--quality-only", action="store_true", help="only the Δbpb table (keeps saved speeds)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.quality_only and not args.checkpoint:
        parser.error("--quality-only needs --checkpoint")
    # What this run does not measure (the other model, the quality table) is kept as saved.
    out = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"speed": {}}
    out.update(
        machine=platform.machine(),
        cpu=cpu_capability().model or platform.processor(),
        decode_kernels=cpu_decode.isa_for(),
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
    )
    print(
        "| model | weights | resident MB | decode b1 tok/s | ×fp32 | planned ×fp32 "
        "| decode b8 tok/s | ×fp32 |"
    )
    for name in [] if args.quality_only else [args.only] if args.only else list(MODELS):
        out["speed"][name] = r = bench_speed(name, args.reps)
        for label, m in r.items():
            print(
                f"| {name} | {label} | {m['resident_weight_bytes'] / 1e6:.1f} | "
                f"{m['decode_b1']:.1f} | {m['ratio_b1']:.2f} | {m['planned_ratio_b1']:.2f} | "
                f"{m['decode_b8']:.1f} | "
                f"{m['ratio_b8']:.2f} |"
            )
    if "large" in out["speed"] and not args.quality_only:
        large = out["speed"]["large"]
        out["targets"] = {}
        for (label, key), target in TARGETS.items():
            ratio = large[label][f"ratio_{key}"]
            torchao = [large[o][f"ratio_{key}"] for o in large if "torchao" in o]
            ahead = all(ratio >= other for other in torchao) if torchao else None
            out["targets"][f"{label} {key}"] = {
                "ratio": ratio,
                "target": target,
                "met": ratio >= target,
                "ahead_of_torchao": ahead,
            }
            print(
                f"target {label} {key}: {ratio:.2f}x (≥ {target}x: {ratio >= target}); "
                f"ahead of torchao: {ahead}"
            )
    if args.checkpoint:
        out["quality"] = q = bench_quality(args.checkpoint)
        print("| weights | bpb | Δ vs fp32 |")
        for label, row in q.items():
            print(f"| {label} | {row['bpb']:.4f} | {row['delta']:+.4f} |")
    write_json(RESULTS, out)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
