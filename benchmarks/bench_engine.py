"""The inference engine's paged KV cache, prefix caching and speculative decoding, each against
the engine without it.

Four parts, each run side by side in one process, in interleaved repetitions (medians and the
median of per-repetition ratios are reported):

- Prefix caching. A model with a 2,048-token context (random weights, d_model 256, 4 layers;
   speed does not depend on the weights' values) serves 16 chat requests submitted at once,
   each a shared 1,000-token system prompt and its own 24-token question, one token each, once
   the system prompt is in the cache (one earlier request put it there, as a server's first
   chat does). Time to first token of each request is measured from submission; the engine
   with `prefix_caching=False` is the reference. Target: >= 5x lower with caching.

- Scoring over the prefix cache. The same model scores a 5-shot multiple-choice job as an
   evaluation sends it: 32 questions, each context the same 800 tokens of examples and its own
   40-token question, 4 choices of 8 tokens (128 requests, one `Engine.score` call). The engine
   with prefix caching computes the shared examples once and each question over them
   (lmforge.infer.cached_score); with `prefix_caching=False` it scores each context whole,
   packed with its choices (lmforge.infer.score), which is the reference. The cache is emptied
   before each timed job, so only sharing inside the job counts. Reported: seconds a job, the
   ratio, and the largest difference between the two sides' log-likelihoods.

- Paged memory. At a fixed KV budget of 8 x 2,048 positions (what a slot cache needs for 8
   full contexts), 96 requests of mixed lengths (prompts 16-512 tokens, outputs 16-256, seeded)
   go to an engine allowed 256 running requests. Reported: the most requests running at once
   (a slot cache of that budget runs 8), preemptions, and whether every greedy output equals the
   same requests' output on an engine with room for all of them (no preemption).

- Speculative decoding. Batch-1 greedy decode of continuations of Python source: --spec-prompts
   prompts of --spec-prompt-tokens tokens cut from the validation split of --checkpoint's run
   (the built-in corpus is the standard library's source; --shards: that run's token shards),
   --spec-new-tokens new tokens each, on the trained checkpoint: plain decoding, prompt lookup
   (n-gram drafts), and a smaller trained checkpoint with the same tokenizer as the draft model
   (--draft). Tokens/s, output identity
   and the acceptance rate (kept drafts / drafted). Target: prompt lookup >= 1.8x plain decoding;
   the draft model faster than plain decoding. Skipped with a note without --checkpoint.

Writes benchmarks/results/engine.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from datetime import date
from pathlib import Path

import torch

import lmforge
from lmforge.atomic import write_json
from lmforge.device.cpuinfo import read_cpuinfo
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.model import ModelConfig, Transformer

RESULTS = Path(__file__).parent / "results" / "engine.json"


class Bytes:
    """A tokenizer stub with no special tokens: nothing stops before max_tokens."""

    special_tokens: dict[str, int] = {}  # noqa: RUF012

    def token_bytes(self, token: int) -> bytes:
        return b"x"


def random_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=4096, d_model=256, n_layers=4, n_heads=4, n_kv_heads=4, max_seq_len=2048
    )
    return Transformer(config).eval()


def ttfts(engine: Engine, prompts: list[list[int]]) -> list[float]:
    """Seconds from submission to the first token of each prompt, all submitted at once."""
    with engine._wake:  # the engine's thread sees all of them in its next step
        started = time.perf_counter()
        handles = [engine.submit(p, SamplingParams(max_tokens=1, temperature=0)) for p in prompts]
    firsts = []
    for handle in handles:
        next(iter(handle))
        firsts.append(time.perf_counter() - started)
    return firsts


def prefix_part(reps: int) -> dict:
    model = random_model()
    rng = random.Random(0)
    system = [rng.randrange(4096) for _ in range(1000)]
    prompts = [system + [rng.randrange(4096) for _ in range(24)] for _ in range(16)]
    engines = with_and_without_prefix_caching(model, max_batch_size=16)
    for engine in engines.values():  # the first chat: the system prompt goes into the cache
        ttfts(engine, [[*system, 1, 2, 3]])
    runs: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(reps):
        for name, engine in engines.items():
            runs[name].append(statistics.mean(ttfts(engine, prompts)))
    hit_rate = engines["cached"].prefix_cache_hit_rate
    for engine in engines.values():
        engine.close()
    return {
        "requests": 16,
        "system_prompt_tokens": 1000,
        "question_tokens": 24,
        "context": 2048,
        **side_by_side(runs, "mean_ttft_s", "ttft_uncached_over_cached"),
        "prefix_cache_hit_rate": round(hit_rate, 3),
    }


def with_and_without_prefix_caching(model: Transformer, **settings) -> dict[str, Engine]:
    return {
        "cached": Engine(model, Bytes(), prefix_caching=True, **settings),
        "uncached": Engine(model, Bytes(), prefix_caching=False, **settings),
    }


def side_by_side(runs: dict[str, list[float]], seconds: str, ratio: str) -> dict:
    """Each side's median seconds and every repetition's, and the median of the repetitions'
    uncached / cached ratios."""
    ratios = [u / c for u, c in zip(runs["uncached"], runs["cached"], strict=True)]
    return {
        seconds: {name: round(statistics.median(v), 4) for name, v in runs.items()},
        f"{seconds}_all": {name: [round(x, 4) for x in v] for name, v in runs.items()},
        ratio: round(statistics.median(ratios), 2),
    }


def scoring_part(reps: int) -> dict:
    model = random_model()
    rng = random.Random(0)
    examples = [rng.randrange(4096) for _ in range(800)]
    requests = []
    for _ in range(32):
        context = examples + [rng.randrange(4096) for _ in range(40)]
        requests += [(context, [rng.randrange(4096) for _ in range(8)]) for _ in range(4)]
    engines = with_and_without_prefix_caching(model)
    runs: dict[str, list[float]] = {name: [] for name in engines}
    scores = {}
    for _ in range(reps):
        for name, engine in engines.items():
            engine.scheduler.pool.clear_cache()  # the engine is idle: only this job's sharing
            started = time.perf_counter()
            scores[name] = engine.score(requests)
            runs[name].append(time.perf_counter() - started)
    for engine in engines.values():
        engine.close()
    diff = max(
        abs(a - b)
        for x, y in zip(scores["cached"], scores["uncached"], strict=True)
        for a, b in zip(x.logprobs, y.logprobs, strict=True)
    )
    return {
        "questions": 32,
        "choices": 4,
        "shared_tokens": 800,
        "question_tokens": 40,
        "choice_tokens": 8,
        "context": 2048,
        **side_by_side(runs, "job_s", "uncached_over_cached"),
        "max_abs_logprob_diff": diff,
    }


def paged_part() -> dict:
    model = random_model()
    rng = random.Random(1)
    prompts = [[rng.randrange(4096) for _ in range(rng.randint(16, 512))] for _ in range(96)]
    params = [SamplingParams(max_tokens=rng.randint(16, 256), temperature=0) for _ in prompts]
    budget = 8 * 2048
    engine = Engine(model, Bytes(), max_batch_size=256, max_kv_tokens=budget)
    running, preempted = [], []
    schedule = engine.scheduler.schedule

    def spy():
        step = schedule()
        running.append(len(engine.scheduler.running))
        preempted.append(len(step.preempted))
        return step

    engine.scheduler.schedule = spy
    started = time.perf_counter()
    with engine:
        paged = engine.generate(prompts, params)
    wall = time.perf_counter() - started
    roomy = Engine(model, Bytes(), max_batch_size=256, max_kv_tokens=96 * 2048)
    with roomy:
        reference = roomy.generate(prompts, params)
    slots = budget // model.config.max_seq_len
    return {
        "kv_budget_positions": budget,
        "requests": len(prompts),
        "prompt_tokens_range": [16, 512],
        "output_tokens_range": [16, 256],
        "slot_cache_concurrent": slots,
        "paged_max_concurrent": max(running),
        "paged_mean_concurrent": round(statistics.mean(running), 1),
        "preemptions": sum(preempted),
        "identical_greedy_outputs": [c.token_ids for c in paged]
        == [c.token_ids for c in reference],
        "wall_s": round(wall, 1),
        "concurrent_vs_slot_cache": round(max(running) / slots, 2),
    }


def speculative_part(checkpoint: str, draft: str | None, args: argparse.Namespace) -> dict:
    from lmforge.tokens import load_tokens
    from lmforge.train.checkpoint import load_checkpoint

    model, tokenizer = load_checkpoint(checkpoint)
    model = model.float().eval()
    tokens = load_tokens(args.shards, "val")
    n, length = args.spec_prompts, args.spec_prompt_tokens
    stride = max(1, (len(tokens) - length) // n)
    prompts = [tokens[i * stride : i * stride + length].tolist() for i in range(n)]
    params = SamplingParams(max_tokens=args.spec_new_tokens, temperature=0)
    sides: dict[str, Engine] = {
        "plain": Engine(model, tokenizer, max_batch_size=1),
        "prompt lookup": Engine(model, tokenizer, max_batch_size=1, speculative="ngram"),
    }
    if draft:
        small, _ = load_checkpoint(draft)
        sides["draft model"] = Engine(
            model, tokenizer, max_batch_size=1, speculative=small.float().eval()
        )
    rows = []
    for threads in args.spec_threads:
        torch.set_num_threads(threads)
        for engine in sides.values():  # warm-up
            engine.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0))
        rates: dict[str, list[float]] = {name: [] for name in sides}
        outputs: dict[str, list[list[int]]] = {}
        for _ in range(args.reps):
            for name, engine in sides.items():
                started = time.perf_counter()
                done = [engine.generate([p], params)[0] for p in prompts]
                wall = time.perf_counter() - started
                rates[name].append(sum(len(c.token_ids) for c in done) / wall)
                outputs[name] = [c.token_ids for c in done]
        for name, engine in sides.items():
            ratios = [r / p for r, p in zip(rates[name], rates["plain"], strict=True)]
            rows.append(
                {
                    "side": name,
                    "threads": threads,
                    "tokens_per_s": round(statistics.median(rates[name]), 1),
                    "tokens_per_s_all": [round(r, 1) for r in rates[name]],
                    "vs_plain": round(statistics.median(ratios), 2),
                    "acceptance_rate": round(engine.acceptance_rate, 3)
                    if name != "plain"
                    else None,
                    "identical_to_plain": outputs[name] == outputs["plain"],
                }
            )
    for engine in sides.values():
        engine.close()
    torch.set_num_threads(args.threads)
    return {
        "checkpoint": str(checkpoint),
        "draft": str(draft) if draft else None,
        "prompts": n,
        "prompt_tokens": length,
        "new_tokens": args.spec_new_tokens,
        "draft_tokens": sides["prompt lookup"].speculative_tokens,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--checkpoint", help="trained run folder or checkpoint (part 3)")
    parser.add_argument("--draft", help="a smaller trained checkpoint, same tokenizer (part 3)")
    parser.add_argument("--shards", help="the token shards of --checkpoint's run (part 3)")
    parser.add_argument(
        "--spec-threads",
        type=lambda text: [int(t) for t in text.split(",")],
        default=[1, 2],
        help="torch threads for part 3, each measured (a small model decodes fastest on one)",
    )
    parser.add_argument("--spec-prompts", type=int, default=8)
    parser.add_argument("--spec-prompt-tokens", type=int, default=128)
    parser.add_argument("--spec-new-tokens", type=int, default=64)
    parser.add_argument("--parts", default="prefix,scoring,paged,speculative")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    parts = args.parts.split(",")
    out: dict = {
        "cpu": read_cpuinfo().model or platform.machine(),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "date": date.today().isoformat(),
        "torch": torch.__version__,
        "lmforge": lmforge.__version__,
        "repetitions": args.reps,
    }
    if "prefix" in parts:
        out["prefix_caching"] = prefix_part(args.reps)
        print("prefix caching:", out["prefix_caching"]["mean_ttft_s"])
    if "scoring" in parts:
        out["scoring"] = scoring_part(args.reps)
        print("scoring over the prefix cache:", out["scoring"]["job_s"])
    if "paged" in parts:
        out["paged_memory"] = paged_part()
        print("paged memory:", out["paged_memory"])
    if "speculative" in parts:
        if args.checkpoint and args.shards:
            out["speculative"] = speculative_part(args.checkpoint, args.draft, args)
            print("speculative:", out["speculative"]["rows"])
        else:
            print("speculative decoding skipped: pass --checkpoint and --shards of a trained run")
    previous = {}
    if RESULTS.exists():  # parts not rerun keep their last results
        import json

        previous = json.loads(RESULTS.read_text())
    out["ratios"] = {
        **previous.get("ratios", {}),
        **({"ttft_uncached_over_cached": out["prefix_caching"]["ttft_uncached_over_cached"]}
           if "prefix_caching" in out else {}),
        **({"scoring_uncached_over_cached": out["scoring"]["uncached_over_cached"]}
           if "scoring" in out else {}),
        **({"concurrent_vs_slot_cache": out["paged_memory"]["concurrent_vs_slot_cache"]}
           if "paged_memory" in out else {}),
        **({f"{r['side']} vs plain, {r['threads']} thread(s)": r["vs_plain"]
            for r in out["speculative"]["rows"] if r["side"] != "plain"}
           if "speculative" in out else {}),
    }  # fmt: skip
    write_json(RESULTS, {**previous, **out})
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
