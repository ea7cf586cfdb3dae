"""Evaluation speed: lmforge's evaluator against lm-evaluation-harness's hf backend, side by side.

One multiple-choice task, one checkpoint, two evaluators, in one run:

- the task: lmforge's `code_next_line` (the true next line of a function against 3 lines drawn
  from other files, 4 choices), 500 examples built from the validation split of the Python
  standard library (DataConfig's val_fraction, 0.01, the speedrun's split), written as a JSONL
  file and an lm-eval task YAML over it (`dataset_path: json`). Both sides run that one YAML:
  lmforge with `load_spec` + `run_task`, lm-eval with `simple_evaluate` and a TaskManager that
  includes its folder;
- the checkpoint: a randomly initialised model (speed does not depend on the weights' values)
  saved with `save_checkpoint` and exported with `export_hf`, in fp32. lmforge reads the
  checkpoint (`EngineBackend.from_checkpoint`), lm-eval the Hugging Face folder (`HFLM`,
  dtype float32, transformers' LlamaForCausalLM). Tokenizer: the speedrun's prepared one
  (vocabulary 4096) where it is cached, else one trained here on the standard library's
  training split with `train_bpe`;
- two shapes: "speedrun" (the `small` preset's model: d_model 256, 4 layers, context 256) and
  "134M" (bench_infer's large shape, d_model 768, 12 layers, 12 heads, context 512, here with
  the tokenizer's vocabulary of 4096 rather than 32,000, so 91M parameters), on the first
  --limit-134m examples only (default 100: lm-eval needs minutes per pass on 2 cores);
- both on the CPU with the same torch thread count (--threads, default 2, this machine's cores);
  the engine's scheduler thread inherits it (checked).

Timed: the evaluation only, each side's model loaded once (one `EngineBackend`, one `HFLM`
object passed as `model=`), from the task YAML to the metrics: `run_task(load_spec(...))` and
`simple_evaluate(model=lm, tasks=[...], log_samples=True, bootstrap_iters=0)`. The time inside
each side's `loglikelihood` call (the model's part) is recorded beside it. One untimed warm-up
pass of 16 examples per side first, then --reps (default 2) repetitions, interleaved
(lm-eval, lmforge, lm-eval, lmforge...); medians of examples/s are reported. lm-eval's batch
size is the fastest of --lm-eval-batches (8, 16, 32) on the first 64 examples of the speedrun
shape (each timed twice, interleaved, its better time kept), or --lm-eval-batch N; "auto"
(lm-eval's `_detect_batch_size`) halves from max_batch_size=64 only on running out of memory,
so on this CPU it is 64, not a choice of its own. Paired ratios (each repetition's two runs
ran back to back, under the same load on a shared machine) are reported beside the ratio of
medians.

Agreement, the proof that both measure the same thing: the same accuracy and per-example,
per-choice log-likelihoods within 1e-3 (the max absolute difference is reported).

Target: lmforge >= 3x lm-eval's examples/s on each shape.

HumanEval's execution ("humaneval"), the price of the sandbox: HumanEval's 164 canonical
solutions (each assembled with its tests as `score_humaneval` does) run through `run_programs`
(--workers, default 2, as `lmforge eval` runs them) behind bubblewrap and behind the guard
alone (eval/sandbox.py), one untimed warm-up pass each, then --humaneval-reps (default 3)
passes per side, interleaved (guard, bwrap, guard, bwrap...). Reported: the median
programs/s of each side, the paired ratio of each repetition (bwrap / guard, back to back),
the median wall time of one program, and that every solution passed on both sides.

Writes benchmarks/results/bench_eval.json. `--parts humaneval` measures the HumanEval part
alone and replaces only its section of an existing results file (the section records its own
machine, date and commit).

    python benchmarks/bench_eval.py [--reps 2] [--threads 2] [--examples 500]
        [--limit-134m 100] [--shapes speedrun,134M] [--lm-eval-batch N]
        [--parts lm-eval,humaneval] [--humaneval-reps 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from lmforge.atomic import write_json
from lmforge.config import small
from lmforge.data import is_validation, stdlib_documents
from lmforge.device.cpuinfo import read_cpuinfo
from lmforge.eval.backend import EngineBackend
from lmforge.eval.code_suite import code_suite
from lmforge.eval.execution import run_programs
from lmforge.eval.harness import run_task
from lmforge.eval.humaneval import humaneval_program, load_humaneval
from lmforge.eval.sandbox import bwrap_unavailable
from lmforge.eval.tasks import load_spec
from lmforge.model import ModelConfig, Transformer
from lmforge.model.hf import export_hf
from lmforge.prepare import DataConfig
from lmforge.speedrun import cache_root
from lmforge.tokenizer import Tokenizer, train_bpe
from lmforge.train.checkpoint import save_checkpoint

RESULTS = Path(__file__).parent / "results" / "bench_eval.json"
TASK = "bench_code_next_line"
TARGET = 3.0  # lmforge's examples/s over lm-eval's
TOLERANCE = 1e-3  # per-choice log-likelihoods
WARMUP_EXAMPLES, SWEEP_EXAMPLES = 16, 64
SHAPES = {  # d_model, layers, heads, context
    "speedrun": (256, 4, 4, 256),
    "134M": (768, 12, 12, 512),
}


def tokenizer_dir(work: Path) -> tuple[Path, str]:
    """The speedrun's prepared tokenizer where cached, else one trained here (vocab 4096)."""
    cfg = small()
    cached = cache_root(cfg) / "tokenizer"
    if (cached / "tokenizer.json").is_file():
        return cached, f"the speedrun's prepared tokenizer ({cached})"
    fraction = cfg.data.val_fraction
    texts = (d.text for d in stdlib_documents() if not is_validation(d.id, fraction))
    tokenizer = train_bpe(texts, cfg.tokenizer.vocab_size, cfg.tokenizer.special_tokens)
    tokenizer.save(work / "tokenizer")
    return work / "tokenizer", "trained here with train_bpe on the stdlib's training split"


def write_task(folder: Path, examples: int) -> tuple[Path, float]:
    """`examples` code_next_line documents as JSONL + an lm-eval task YAML over them."""
    fraction = DataConfig.val_fraction
    validation = [d for d in stdlib_documents() if is_validation(d.id, fraction)]
    suite = {t.spec.task: t for t in code_suite(validation, examples)}
    task = suite["code_next_line"]
    if len(task.docs) < examples:
        raise SystemExit(
            f"the validation split ({fraction:g}) gives {len(task.docs)} examples, not "
            f"{examples}: lower --examples"
        )
    data = folder / "code_next_line.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in task.docs))
    spec = task.spec
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\noutput_type: multiple_choice\ndataset_path: json\ntest_split: test\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"doc_to_text: {spec.doc_to_text}\ndoc_to_choice: {spec.doc_to_choice}\n"
        f"doc_to_target: {spec.doc_to_target}\n"
        f"target_delimiter: {json.dumps(spec.target_delimiter)}\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    return folder / f"{TASK}.yaml", fraction


def build_checkpoint(shape: str, tok_dir: Path, work: Path) -> tuple[Path, Path, int]:
    """A random fp32 model of `shape`: lmforge's checkpoint and its Hugging Face export."""
    tokenizer = Tokenizer.load(tok_dir)
    d_model, layers, heads, context = SHAPES[shape]
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=d_model,
        n_layers=layers,
        n_heads=heads,
        max_seq_len=context,
    )
    torch.manual_seed(0)
    model = Transformer(config).float().eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint = save_checkpoint(work / "ckpt", 0, model, optimizer, {}, {}, {}, tok_dir)
    hf_dir = export_hf(model, tokenizer, work / "hf")
    return checkpoint, hf_dir, model.num_params()


class Timed:
    """Wraps an object's `loglikelihood` to add up the seconds spent in it (with `extra`
    keyword arguments)."""

    def __init__(self, obj, **extra) -> None:
        self.seconds = 0.0
        inner = obj.loglikelihood

        def loglikelihood(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs, **extra)
            finally:
                self.seconds += time.perf_counter() - start

        obj.loglikelihood = loglikelihood


class LmEvalSide:
    def __init__(self, hf_dir: Path, batch_size: int, task_dir: Path) -> None:
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager

        self.lm = HFLM(pretrained=str(hf_dir), dtype="float32", batch_size=batch_size, device="cpu")
        self.timer = Timed(self.lm, disable_tqdm=True)  # its progress bars
        self.task_manager = TaskManager(include_path=str(task_dir))

    def run(self, limit: int) -> dict:
        import lm_eval

        out = lm_eval.simple_evaluate(
            model=self.lm,
            tasks=[TASK],
            task_manager=self.task_manager,
            limit=limit,
            log_samples=True,
            bootstrap_iters=0,
            verbosity="ERROR",
        )
        rows = sorted(out["samples"][TASK], key=lambda r: r["doc_id"])
        metrics = out["results"][TASK]
        return {
            "lls": [[float(resp[0][0]) for resp in row["resps"]] for row in rows],
            "acc": metrics["acc,none"],
            "acc_norm": metrics["acc_norm,none"],
        }


class LmforgeSide:
    def __init__(self, checkpoint: Path, spec_path: Path) -> None:
        self.backend = EngineBackend.from_checkpoint(checkpoint, "cpu")
        self.timer = Timed(self.backend)
        self.spec_path = spec_path

    def run(self, limit: int) -> dict:
        result = run_task(self.backend, load_spec(self.spec_path), limit=limit)
        return {
            "lls": [r["loglikelihoods"] for r in result.records],
            "acc": result.metrics["acc"],
            "acc_norm": result.metrics["acc_norm"],
        }

    def engine_threads(self) -> tuple[str, int]:
        """The thread scoring runs on and torch's thread count there, seen by a forward hook."""
        seen = []

        def hook(module, args):
            seen.append((threading.current_thread().name, torch.get_num_threads()))

        handle = self.backend.engine.model.register_forward_pre_hook(hook)
        try:
            self.backend.engine.score([([1], [2])])
        finally:
            handle.remove()
        return seen[0]

    def close(self) -> None:
        self.backend.close()


def timed_run(side, limit: int) -> dict:
    side.timer.seconds = 0.0
    cpu, start = time.process_time(), time.perf_counter()
    out = side.run(limit)
    wall = time.perf_counter() - start
    out.update(
        wall_s=wall,
        cpu_s=time.process_time() - cpu,
        loglikelihood_s=side.timer.seconds,
        examples=len(out["lls"]),
        examples_per_s=len(out["lls"]) / wall,
    )
    return out


def pick_lm_eval_batch(hf_dir: Path, task_dir: Path, candidates: list[int]) -> dict:
    """lm-eval's fastest batch size of `candidates` on SWEEP_EXAMPLES examples: each warmed up,
    then timed twice, interleaved, its better time kept (the machine is shared)."""
    sides = {batch: LmEvalSide(hf_dir, batch, task_dir) for batch in candidates}
    for side in sides.values():
        side.run(WARMUP_EXAMPLES)
    rates: dict[int, float] = {}
    for _ in range(2):
        for batch, side in sides.items():
            rate = timed_run(side, SWEEP_EXAMPLES)["examples_per_s"]
            rates[batch] = max(rates.get(batch, 0.0), rate)
    for batch, rate in rates.items():
        print(f"  lm-eval batch {batch}: {rate:.1f} examples/s", flush=True)
    return {"chosen": max(rates, key=rates.get), "examples_per_s": rates}


def compare(a: dict, b: dict) -> dict:
    diffs = [
        abs(x - y)
        for row_a, row_b in zip(a["lls"], b["lls"], strict=True)
        for x, y in zip(row_a, row_b, strict=True)
    ]
    worst = max(diffs)
    return {
        "max_abs_ll_diff": worst,
        "same_acc": a["acc"] == b["acc"],
        "same_acc_norm": a["acc_norm"] == b["acc_norm"],
        "agree": worst <= TOLERANCE and a["acc"] == b["acc"],
    }


def bench_shape(shape, limit, reps, batch, tok_dir, task_dir, spec_path, work) -> dict:
    checkpoint, hf_dir, params = build_checkpoint(shape, tok_dir, work)
    sides = {
        "lm-eval": LmEvalSide(hf_dir, batch, task_dir),
        "lmforge": LmforgeSide(checkpoint, spec_path),
    }
    engine_threads = sides["lmforge"].engine_threads()
    for side in sides.values():
        side.run(WARMUP_EXAMPLES)
    runs = {name: [] for name in sides}
    for rep in range(reps):
        for name, side in sides.items():
            run = timed_run(side, limit)
            runs[name].append(run)
            print(
                f"  {shape} rep {rep + 1}/{reps} {name}: {run['examples_per_s']:.2f} examples/s "
                f"({run['wall_s']:.1f} s, loglikelihood {run['loglikelihood_s']:.1f} s), "
                f"acc {run['acc']:.4f}",
                flush=True,
            )
    sides["lmforge"].close()
    checks = [compare(a, b) for a, b in zip(runs["lm-eval"], runs["lmforge"], strict=True)]
    summary = {}
    for name, rs in runs.items():
        summary[name] = {
            "examples_per_s": statistics.median(r["examples_per_s"] for r in rs),
            "wall_s": statistics.median(r["wall_s"] for r in rs),
            "loglikelihood_s": statistics.median(r["loglikelihood_s"] for r in rs),
            "cpu_s": statistics.median(r["cpu_s"] for r in rs),
            "acc": rs[0]["acc"],
            "acc_norm": rs[0]["acc_norm"],
            "per_rep_examples_per_s": [round(r["examples_per_s"], 3) for r in rs],
            "per_rep_wall_s": [round(r["wall_s"], 2) for r in rs],
        }
    ratio = summary["lmforge"]["examples_per_s"] / summary["lm-eval"]["examples_per_s"]
    paired = [  # each repetition's pair ran back to back, under the same load
        b["examples_per_s"] / a["examples_per_s"]
        for a, b in zip(runs["lm-eval"], runs["lmforge"], strict=True)
    ]
    ll_ratio = summary["lm-eval"]["loglikelihood_s"] / summary["lmforge"]["loglikelihood_s"]
    return {
        "params": params,
        "model": dict(
            zip(("d_model", "n_layers", "n_heads", "max_seq_len"), SHAPES[shape], strict=True)
        ),
        "examples": limit,
        "lm_eval_batch_size": batch,
        "engine_thread_torch_threads": engine_threads,
        "summary": summary,
        "ratio": ratio,
        "ratio_per_rep": [round(r, 3) for r in paired],
        "ratio_loglikelihood_only": ll_ratio,
        "target_met": ratio >= TARGET,
        "agreement": {
            "max_abs_ll_diff": max(c["max_abs_ll_diff"] for c in checks),
            "same_acc": all(c["same_acc"] for c in checks),
            "same_acc_norm": all(c["same_acc_norm"] for c in checks),
            "agree": all(c["agree"] for c in checks),
        },
    }


def bench_humaneval(reps: int, workers: int) -> dict:
    """Programs/s of HumanEval's canonical solutions behind bwrap and behind the guard alone."""
    problems = load_humaneval()
    sources = [humaneval_program(p, p["canonical_solution"]) for p in problems]
    if reason := bwrap_unavailable():
        raise SystemExit(f"bubblewrap cannot run here, so there is nothing to compare: {reason}")
    kinds = ("guard", "bwrap")
    for kind in kinds:  # warm-up: the page cache, the probe, bwrap's first start
        run_programs(sources, workers=workers, timeout_s=10.0, sandbox=kind)
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for rep in range(reps):
        for kind in kinds:
            start = time.perf_counter()
            results = run_programs(sources, workers=workers, timeout_s=10.0, sandbox=kind)
            wall = time.perf_counter() - start
            failed = [p["task_id"] for p, r in zip(problems, results, strict=True) if not r.passed]
            runs[kind].append(
                {
                    "programs_per_s": len(sources) / wall,
                    "wall_s": wall,
                    "program_wall_s": statistics.median(r.wall_s for r in results),
                    "failed": failed,
                    "sandboxes": sorted({r.sandbox for r in results}),
                }
            )
            print(
                f"  humaneval rep {rep + 1}/{reps} {kind}: "
                f"{len(sources) / wall:.1f} programs/s ({wall:.1f} s), {len(failed)} failed",
                flush=True,
            )
    summary = {
        kind: {
            "programs_per_s": statistics.median(r["programs_per_s"] for r in rs),
            "wall_s": statistics.median(r["wall_s"] for r in rs),
            "program_wall_s": statistics.median(r["program_wall_s"] for r in rs),
            "all_passed": not any(r["failed"] for r in rs),
            "ran_behind": sorted({k for r in rs for k in r["sandboxes"]}),
            "per_rep_programs_per_s": [round(r["programs_per_s"], 2) for r in rs],
        }
        for kind, rs in runs.items()
    }
    paired = [
        b["programs_per_s"] / a["programs_per_s"]
        for a, b in zip(runs["guard"], runs["bwrap"], strict=True)
    ]
    bwrap_version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True)
    return {
        "programs": len(sources),
        "what": "HumanEval's canonical solutions with their tests, through run_programs",
        "workers": workers,
        "repetitions": reps,
        "measured_at": datetime.date.today().isoformat(),
        "cpu": read_cpuinfo().model,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "bwrap": bwrap_version.stdout.strip(),
        "as_root": os.geteuid() == 0,
        "source": source_state(),
        "load_average_after": os.getloadavg(),
        "summary": summary,
        "ratio": summary["bwrap"]["programs_per_s"] / summary["guard"]["programs_per_s"],
        "ratio_per_rep": [round(r, 3) for r in paired],
    }


def source_state() -> dict:
    """The commit measured, and lmforge's files changed since it (measured as they are)."""

    def git(*args: str) -> str:
        root = Path(__file__).resolve().parent.parent
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return done.stdout.strip()

    changed = git("status", "--porcelain", "--", "lmforge").splitlines()
    return {"commit": git("rev-parse", "HEAD"), "lmforge_uncommitted": changed}


def print_table(results: dict) -> None:
    print()
    print("| shape | params | examples | side | examples/s | s total | s in loglikelihood | acc |")
    print("|---|---|---|---|---|---|---|---|")
    for shape, r in results.items():
        for name, s in r["summary"].items():
            print(
                f"| {shape} | {r['params'] / 1e6:.1f}M | {r['examples']} | {name} | "
                f"{s['examples_per_s']:.2f} | {s['wall_s']:.1f} | {s['loglikelihood_s']:.1f} | "
                f"{s['acc']:.4f} |"
            )
    print()
    for shape, r in results.items():
        a = r["agreement"]
        print(
            f"{shape}: lmforge / lm-eval = {r['ratio']:.2f}x examples/s (per repetition "
            f"{', '.join(f'{x:.2f}x' for x in r['ratio_per_rep'])}; "
            f"{r['ratio_loglikelihood_only']:.2f}x in loglikelihood alone); target >= "
            f"{TARGET:g}x {'met' if r['target_met'] else 'NOT met'}; max |ll diff| "
            f"{a['max_abs_ll_diff']:.2e}, same acc {a['same_acc']}, "
            f"{'agree' if a['agree'] else 'DISAGREE'} (tolerance {TOLERANCE:g})"
        )


def print_humaneval(r: dict) -> None:
    s = r["summary"]
    print(
        f"HumanEval, {r['programs']} programs, {r['workers']} workers: bwrap "
        f"{s['bwrap']['programs_per_s']:.1f} programs/s, guard {s['guard']['programs_per_s']:.1f}"
        f" ({r['ratio']:.2f}x; per repetition "
        f"{', '.join(f'{x:.2f}x' for x in r['ratio_per_rep'])}); one program "
        f"{s['bwrap']['program_wall_s'] * 1e3:.0f} ms vs {s['guard']['program_wall_s'] * 1e3:.0f}"
        f" ms; all passed: bwrap {s['bwrap']['all_passed']}, guard {s['guard']['all_passed']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2, help="interleaved repetitions per side")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for both sides")
    parser.add_argument("--examples", type=int, default=500, help="examples (speedrun shape)")
    parser.add_argument("--limit-134m", type=int, default=100, help="examples (134M shape)")
    parser.add_argument("--shapes", default="speedrun,134M")
    parser.add_argument("--lm-eval-batch", type=int, help="lm-eval's batch size (no sweep)")
    parser.add_argument("--lm-eval-batches", default="8,16,32", help="the sweep's candidates")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--parts", default="lm-eval,humaneval", help="lm-eval, humaneval")
    parser.add_argument("--humaneval-reps", type=int, default=3, help="passes per side")
    parser.add_argument("--workers", type=int, default=2, help="programs run at once")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if parts == {"humaneval"}:  # only this section of the results file is replaced
        out = json.loads(args.out.read_text()) if args.out.exists() else {}
        out["humaneval"] = bench_humaneval(args.humaneval_reps, args.workers)
        print_humaneval(out["humaneval"])
        write_json(args.out, out)
        print(f"wrote {args.out}")
        return
    torch.set_num_threads(args.threads)
    import accelerate
    import lm_eval
    import transformers

    shapes = args.shapes.split(",")
    started = time.perf_counter()
    results, sweep = {}, None
    with tempfile.TemporaryDirectory(prefix="bench_eval_") as tmp:
        work = Path(tmp)
        tok_dir, tok_source = tokenizer_dir(work)
        task_dir = work / "tasks"
        task_dir.mkdir()
        spec_path, fraction = write_task(task_dir, args.examples)
        print(f"tokenizer: {tok_source}; {args.examples} examples; {args.threads} threads")
        batch = args.lm_eval_batch
        if batch is None:
            print("lm-eval batch size sweep (speedrun shape):", flush=True)
            _, hf_dir, _ = build_checkpoint("speedrun", tok_dir, work / "sweep")
            candidates = [int(b) for b in args.lm_eval_batches.split(",")]
            sweep = pick_lm_eval_batch(hf_dir, task_dir, candidates)
            batch = sweep["chosen"]
        for shape in shapes:
            limit = args.limit_134m if shape == "134M" else args.examples
            print(f"{shape}: {limit} examples, lm-eval batch {batch}", flush=True)
            results[shape] = bench_shape(
                shape, limit, args.reps, batch, tok_dir, task_dir, spec_path, work / shape
            )
    print_table(results)
    humaneval = None
    if "humaneval" in parts:
        humaneval = bench_humaneval(args.humaneval_reps, args.workers)
        print_humaneval(humaneval)
    cpu = read_cpuinfo()
    out = {
        "task": "code_next_line (lmforge's code suite), 4 choices, as an lm-eval YAML over JSONL",
        "task_data": f"stdlib validation split, val_fraction {fraction:g} (DataConfig default)",
        "tokenizer": tok_source,
        "weights": "random init (speed does not depend on the values), fp32 on both sides",
        "timed": "task YAML to metrics, models loaded once; medians over interleaved reps",
        "target": f"lmforge >= {TARGET:g}x lm-eval examples/s",
        "cpu": cpu.model,
        "cpu_avx512_flags": sorted(f for f in cpu.features if f.startswith("avx512")),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "repetitions": args.reps,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "lm_eval": lm_eval.__version__,
        "source": source_state(),
        "lm_eval_batch_size": batch,
        "lm_eval_batch_sweep": sweep,
        "load_average_after": os.getloadavg(),
        "total_s": round(time.perf_counter() - started, 1),
        "results": results,
        "ratios": {shape: r["ratio"] for shape, r in results.items()},
        "targets_met": {shape: r["target_met"] for shape, r in results.items()},
    }
    if humaneval is not None:
        out["humaneval"] = humaneval
    write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
