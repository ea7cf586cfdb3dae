"""Batch-1 decode against llama.cpp on the same weights, at equal bits per weight, in one run.

One Llama (d_model 768, 12 layers, 12 heads, SwiGLU 2048, a 4,096-token byte-level BPE
tokenizer trained here on the standard library's source: about 85M parameters) is exported by
lmforge's own GGUF writer in f32, f16, q8_0 and q4_0 and decoded by llama.cpp (the
llama-cpp-python bindings); lmforge decodes the same float weights in fp32 and bf16, and their
int8 and int4-g128 (round to nearest) quantizations of every matrix, the output head included as
llama.cpp's q8_0 and q4_0 files have it (`lmforge quantize --quantize-head`), in its engine
with the compiled decode step and weights laid out for one row (`lmforge chat` and `generate`
run that way). Pairs of
equal width: fp32 vs f32, bf16 vs f16 (16 bits), int8 vs q8_0 (8.04 vs 8.5 bits per weight),
int4-g128 vs q4_0 (4.5 bits per weight each).

Both sides run with one thread, then with --threads (default torch's: every core), decode
greedily with end of text ignored, from a 16-token prompt, and are timed by the wall clock from
the first generated token to the last; repetitions alternate between the sides, with a pause
between them (both keep their idle threads spinning for a while, which would slow the other),
and each side's best is reported (the machine's noise only ever slows a run). The warm-up
decodes long enough for the engine to compile its step and choose its thread count (it times
its first steps at each count, lmforge.infer.runner). The weights read per token
are the planner's (plan.inference), so each rate is also given as GB/s.

llama.cpp is not a dependency: install it with `pip install llama-cpp-python` (it compiles
llama.cpp, several minutes). Without it this script says so and exits without writing. Each
exported file is first decoded for a few tokens in a child process: on some CPUs with AMX
(Intel Xeon from Sapphire Rapids on) llama.cpp's AMX kernels crash in their first product
(llama.cpp issue #20824), and the script then says so and how to rebuild llama.cpp without them
instead of dying with it.
Writes benchmarks/results/llamacpp.json.

    python benchmarks/bench_llamacpp.py [--reps 5] [--tokens 128] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import re
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch
from bench_infer import NoSpecials

from lmforge.atomic import write_json
from lmforge.device.capability import cpu_capability
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.runner import TRIAL_STEPS
from lmforge.kernels import cpu_decode
from lmforge.model import ModelConfig, Transformer
from lmforge.plan.inference import quantized_bytes_read, weight_bytes_read
from lmforge.plan.shapes import from_model_config
from lmforge.quant.gguf import export_gguf
from lmforge.quant.quantize import quantize_model
from lmforge.tokenizer import train_bpe

RESULTS = Path(__file__).parent / "results" / "llamacpp.json"
PROMPT = 16
WARM_TOKENS = 4 * TRIAL_STEPS + 8  # compile, then the thread trials of up to 4 counts
PAUSE_S = 0.5  # between the sides: the other side's spinning threads park
PAIRS = {  # lmforge label: llama.cpp file type
    "fp32": "f32",
    "bf16": "f16",
    "int8": "q8_0",
    "int4-g128": "q4_0",
}


def corpus(limit: int = 2_000_000) -> list[str]:
    """Python files of the standard library, up to `limit` characters."""
    texts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        texts.append(path.read_text(errors="replace"))
        size += len(texts[-1])
        if size >= limit:
            break
    return texts


def lmforge_models(model: Transformer) -> dict[str, Transformer]:
    out = {"fp32": model, "bf16": copy.deepcopy(model).bfloat16()}
    for label, scheme, group in (("int8", "int8", None), ("int4-g128", "int4", 128)):
        out[label] = copy.deepcopy(model)
        quantize_model(out[label], scheme, group, quantize_head=True)
    return out


def lmforge_rate(engine: Engine, prompt: list[int], n: int) -> float:
    """Generated tokens/s from the first token to the last."""
    handle = engine.submit(prompt, SamplingParams(max_tokens=n, temperature=0))
    times = [time.perf_counter() for _ in handle]
    return (len(times) - 1) / (times[-1] - times[0])


def llamacpp_rate(llm, prompt: list[int], n: int) -> float:
    llm.reset()
    times = []
    for _ in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
        times.append(time.perf_counter())
        if len(times) == n:
            break
    return (len(times) - 1) / (times[-1] - times[0])


PROBE = """
import sys
from llama_cpp import Llama

llm = Llama(sys.argv[1], n_ctx=64, n_threads=1, n_batch=16, verbose=False)
for i, _ in enumerate(llm.generate([1, 2, 3], top_k=1, temp=0.0)):
    if i == 3:
        break
"""
WITHOUT_AMX = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON '
    '-DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_INT8=OFF" '
    "pip install --force-reinstall --no-cache-dir llama-cpp-python"
)


def decode_failure(files: dict[str, Path], probe: str = PROBE) -> str | None:
    """Why llama.cpp cannot decode one of `files` (each tried in a child process, so that a
    crash in llama.cpp does not take this one with it), or None when it decodes them all."""
    for file_type, path in files.items():
        child = subprocess.run(
            [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=300
        )
        if child.returncode == 0:
            continue
        if child.returncode < 0:
            how = f"it died of {signal.Signals(-child.returncode).name}"
        else:
            how = (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1]
        message = f"llama.cpp cannot decode the {file_type} file on this CPU: {how}"
        if "AMX_INT8 = 1" in llama_cpp_features():
            message += (
                "; its AMX kernels crash on some CPUs (llama.cpp issue #20824): reinstall "
                f"llama-cpp-python without them, {WITHOUT_AMX}, then run this again"
            )
        return message
    return None


def llama_cpp_features() -> str:
    """llama.cpp's list of the CPU features it was built for ('AVX2 = 1 | ...'), or ''."""
    try:
        import llama_cpp
    except ImportError:
        return ""
    return llama_cpp.llama_print_system_info().decode(errors="replace")


def bytes_per_token(config: ModelConfig, label: str) -> float:
    """The planner's weight bytes one decode step reads (the head quantized with the rest)."""
    shape = from_model_config(label, config)
    if label in ("fp32", "bf16"):
        return weight_bytes_read(shape, 1, 4.0 if label == "fp32" else 2.0)
    if label == "int8":
        return quantized_bytes_read(shape, "int8", quantized_head=True)
    return quantized_bytes_read(shape, "int4", 128, quantized_head=True)


def side_by_side(models: dict, files: dict, prompt: list[int], threads: int, args) -> dict:
    """{label: row} of the best tokens/s of each side at `threads` threads."""
    from llama_cpp import Llama

    llms = {
        file_type: Llama(str(path), n_ctx=1024, n_threads=threads, n_batch=64, verbose=False)
        for file_type, path in files.items()
    }
    engines = {
        label: Engine(m, NoSpecials(), max_batch_size=1, compile=True, relayout_weights=True)
        for label, m in models.items()
    }
    for label, file_type in PAIRS.items():  # warm: compile, thread trials, first touches
        lmforge_rate(engines[label], prompt, WARM_TOKENS)
        llamacpp_rate(llms[file_type], prompt, 8)
    best = {label: [0.0, 0.0] for label in PAIRS}
    for _ in range(args.reps):
        for label, file_type in PAIRS.items():
            time.sleep(PAUSE_S)
            ours = lmforge_rate(engines[label], prompt, args.tokens)
            time.sleep(PAUSE_S)
            theirs = llamacpp_rate(llms[file_type], prompt, args.tokens)
            best[label] = [max(best[label][0], ours), max(best[label][1], theirs)]
            print(
                f"{threads} threads {label:10s} lmforge {ours:6.1f} tok/s  llama.cpp {theirs:6.1f}"
            )
    rows = {}
    for label, file_type in PAIRS.items():
        ours, theirs = best[label]
        rows[label] = {
            "llama_cpp_type": file_type,
            "lmforge_tok_s": round(ours, 1),
            "llama_cpp_tok_s": round(theirs, 1),
            "ratio": round(ours / theirs, 3),
            "weight_layout": engines[label].weight_layout,
            "lmforge_decode_threads": engines[label].runner.thread_trials[1].describe(),
        }
        engines[label].close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="the second run's (after 1)"
    )
    args = parser.parse_args()
    try:
        import llama_cpp
    except ImportError:
        print("llama_cpp is not importable: pip install llama-cpp-python, then run this again")
        sys.exit(0)

    tokenizer = train_bpe(corpus(), vocab_size=4096, special_tokens=["<|endoftext|>"], workers=1)
    config = ModelConfig(
        vocab_size=4096, d_model=768, n_layers=12, n_heads=12, d_ff=2048, max_seq_len=1024
    )
    torch.manual_seed(0)
    model = Transformer(config).eval()
    prompt = tokenizer.encode("def main(argv):\n    parser = argparse.ArgumentParser(")[:PROMPT]
    runs, int4_over_int8 = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for file_type in PAIRS.values():
            files[file_type] = Path(tmp) / f"model-{file_type}.gguf"
            export_gguf(model, tokenizer, files[file_type], file_type)
        if failure := decode_failure(files):
            sys.exit(failure)
        models = lmforge_models(model)
        for threads in sorted({1, args.threads}):
            torch.set_num_threads(threads)
            fresh = {label: copy.deepcopy(m) for label, m in models.items()}  # laid out anew
            rows = side_by_side(fresh, files, prompt, threads, args)
            for label, row in rows.items():
                per_token = bytes_per_token(config, label)
                row["lmforge_gb_s"] = round(row["lmforge_tok_s"] * per_token / 1e9, 1)
            runs += [{"threads": threads, "weights": label, **row} for label, row in rows.items()]
            int4, int8 = rows["int4-g128"]["lmforge_tok_s"], rows["int8"]["lmforge_tok_s"]
            int4_over_int8[f"{threads} threads"] = round(int4 / int8, 3)
    out = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_capability().model or platform.processor(),
        "decode_kernels": cpu_decode.isa_for(),
        "torch": torch.__version__,
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_built_for": re.findall(r"(\w+) = 1", llama_cpp_features()),
        "model": {"d_model": 768, "n_layers": 12, "vocab": 4096, "params": model.num_params()},
        "prompt_tokens": PROMPT,
        "generated_tokens": args.tokens,
        "reps": args.reps,
        "runs": runs,
        "lmforge_int4_over_int8": int4_over_int8,
    }
    write_json(RESULTS, out)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
