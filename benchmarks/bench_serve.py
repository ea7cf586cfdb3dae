"""Serving throughput: N concurrent streaming clients against one-at-a-time requests, in one run.

`lmforge serve` runs in its own process on loopback (uvicorn + the continuous-batching engine,
--max-batch-size 16); this process is the load: N closed-loop clients (each sends its next
request when the previous reply ends), streaming chat completions through httpx with usage
reported. N = 1 is the reference: requests one at a time, which is what a server without
batching gives everyone. A second reference is the engine alone: the same requests fed straight
into an in-process Engine with N slots, no HTTP, so server / engine is what the API costs. For
each N: completion tokens/s and requests/s over the wall time of
all its requests, p50/p95 latency (request sent to `[DONE]`) and time to first token. The levels
run interleaved for several repetitions; rates are medians, ratios the median of the ratios
within a repetition, latencies pooled.

The model is the speedrun's `small` shape (vocab 4096, d_model 256, 4 layers, context 256)
with random weights, or `--checkpoint` (e.g. runs/auto). Writes benchmarks/results/serve.json.

    python benchmarks/bench_serve.py [--checkpoint runs/auto] [--reps 5] [--requests 32]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from lmforge.atomic import write_json
from lmforge.infer.engine import Engine
from lmforge.tokenizer.chat_template import ChatTemplate, Message
from lmforge.train.checkpoint import load_checkpoint

RESULTS = Path(__file__).parent / "results" / "serve.json"
LEVELS = (1, 4, 16)
MAX_BATCH = 16
MAX_TOKENS = 64
PROMPTS = [
    "How do I read a file line by line?",
    "Write a function that reverses a list.",
    "What does the with statement do?",
    "Explain list comprehensions.",
    "How do I sort a dict by value?",
    "What is a generator?",
    "Show me a class with a property.",
    "How do I parse JSON?",
]


def random_checkpoint(out: Path) -> Path:
    """A checkpoint of the small preset's shape, random weights, with a BPE tokenizer."""
    from lmforge.config import small
    from lmforge.data.documents import stdlib_root
    from lmforge.model import Transformer
    from lmforge.prepare import TokenizerConfig
    from lmforge.tokenizer import train_bpe
    from lmforge.train.checkpoint import save_checkpoint

    texts = [p.read_text(errors="replace") for p in sorted(stdlib_root().glob("*.py"))[:60]]
    tokenizer = train_bpe(texts, 4096, TokenizerConfig().special_tokens)
    tokenizer.save(out / "tokenizer")
    torch.manual_seed(0)
    model = Transformer(small().model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    save_checkpoint(out / "checkpoints", 0, model, optimizer, {}, {}, {}, out / "tokenizer")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(checkpoint: Path, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "lmforge", "serve", "--checkpoint", str(checkpoint)]
    command += ["--port", str(port), "--max-batch-size", str(MAX_BATCH), "--model-name", "bench"]
    server = subprocess.Popen(command, env={**os.environ, "LMFORGE_PROGRESS": "0"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with code {server.returncode}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
            return server
        except httpx.TransportError:
            time.sleep(0.1)
    server.terminate()
    raise SystemExit("the server did not start within 120 s")


async def one_request(http: httpx.AsyncClient, index: int) -> dict:
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.8,
        "seed": index,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = None
    tokens = 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c["delta"].get("content") for c in chunk["choices"]):
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    return {"latency": end - start, "ttft": (first or end) - start, "tokens": tokens}


async def run_level(base_url: str, clients: int, n_requests: int) -> dict:
    """`clients` closed-loop clients share `n_requests` requests; the level's wall time."""
    queue = list(range(n_requests))
    results: list[dict] = []

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            results.append(await one_request(http, queue.pop(0)))

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(client(http) for _ in range(clients))), 600)
        wall = time.perf_counter() - start
    return {"wall": wall, "requests": results}


def engine_rate(engine, prompts: list[list[int]], n_requests: int, stop_ids) -> float:
    """The same requests straight into an in-process Engine: completion tokens/s without HTTP."""
    from lmforge.infer.engine import SamplingParams

    ids = [prompts[i % len(prompts)] for i in range(n_requests)]
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=i, stop_ids=stop_ids)
        for i in range(n_requests)
    ]
    start = time.perf_counter()
    results = engine.generate(ids, params)
    return sum(len(r.token_ids) for r in results) / (time.perf_counter() - start)


def percentile(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="checkpoint or run folder (default: random weights)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of every level")
    parser.add_argument("--requests", type=int, default=32, help="requests per level and rep")
    args = parser.parse_args()
    os.environ.setdefault("LMFORGE_PROGRESS", "0")

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(args.checkpoint) if args.checkpoint else random_checkpoint(Path(tmp))
        model, tokenizer = load_checkpoint(checkpoint)
        template = ChatTemplate(tokenizer)
        prompts = [template.prompt_ids([Message("user", p)]) for p in PROMPTS]
        engines = {  # laid out as the server lays out its own copy
            n: Engine(copy.deepcopy(model), tokenizer, max_batch_size=n, relayout_weights=True)
            for n in LEVELS
        }
        port = free_port()
        server = start_server(checkpoint, port)
        try:
            base_url = f"http://127.0.0.1:{port}"
            asyncio.run(run_level(base_url, 4, 4))  # warm-up: first-call costs off the clock
            for engine in engines.values():
                engine_rate(engine, prompts, 2, template.stop_ids)
            runs: dict[int, list[dict]] = {n: [] for n in LEVELS}
            direct: dict[int, list[float]] = {n: [] for n in LEVELS}
            for rep in range(args.reps):
                for n in LEVELS:
                    runs[n].append(asyncio.run(run_level(base_url, n, args.requests)))
                    direct[n].append(
                        engine_rate(engines[n], prompts, args.requests, template.stop_ids)
                    )
                print(f"repetition {rep + 1}/{args.reps} done")
        finally:
            server.terminate()
            server.wait(timeout=30)
            for engine in engines.values():
                engine.close()

    rows = []
    for n in LEVELS:
        requests = [r for run in runs[n] for r in run["requests"]]
        tokens_per_s = [sum(r["tokens"] for r in run["requests"]) / run["wall"] for run in runs[n]]
        latency = [r["latency"] for r in requests]
        ttft = [r["ttft"] for r in requests]
        rows.append(
            {
                "clients": n,
                "completion_tokens_per_s": round(statistics.median(tokens_per_s), 1),
                "completion_tokens_per_s_all": [round(t, 1) for t in tokens_per_s],
                "requests_per_s": round(
                    statistics.median(len(run["requests"]) / run["wall"] for run in runs[n]), 2
                ),
                "latency_p50_s": round(percentile(latency, 50), 3),
                "latency_p95_s": round(percentile(latency, 95), 3),
                "ttft_p50_s": round(percentile(ttft, 50), 3),
                "ttft_p95_s": round(percentile(ttft, 95), 3),
                "mean_completion_tokens": round(statistics.mean(r["tokens"] for r in requests), 1),
                "engine_tokens_per_s": round(statistics.median(direct[n]), 1),
                "server_vs_engine": round(
                    statistics.median(t / d for t, d in zip(tokens_per_s, direct[n], strict=True)),
                    2,
                ),
            }
        )
    # Within one repetition the levels ran back to back, so load that drifts between repetitions
    # cancels out of the ratio: the median of per-repetition ratios.
    base = rows[0]["completion_tokens_per_s_all"]
    for row in rows:
        ratios = [t / b for t, b in zip(row["completion_tokens_per_s_all"], base, strict=True)]
        row["vs_sequential"] = round(statistics.median(ratios), 2)

    print()
    print(
        "| concurrent clients | completion tokens/s | vs one at a time | requests/s "
        "| latency p50 / p95 | time to first token p50 / p95 | engine alone, tokens/s "
        "| server / engine |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        latency = f"{r['latency_p50_s']:.2f} s / {r['latency_p95_s']:.2f} s"
        ttft = f"{r['ttft_p50_s'] * 1000:.0f} ms / {r['ttft_p95_s'] * 1000:.0f} ms"
        print(
            f"| {r['clients']} | {r['completion_tokens_per_s']:,.0f} | {r['vs_sequential']:.2f}x "
            f"| {r['requests_per_s']:.2f} | {latency} | {ttft} "
            f"| {r['engine_tokens_per_s']:,.0f} | {r['server_vs_engine']:.2f} |"
        )
    write_json(
        RESULTS,
        {
            "model": str(args.checkpoint or "random weights, small preset shape"),
            "max_batch_size": MAX_BATCH,
            "max_tokens": MAX_TOKENS,
            "requests_per_level": args.requests,
            "repetitions": args.reps,
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "rows": rows,
            "ratios": {
                **{f"clients_{r['clients']}_vs_1_tokens_per_s": r["vs_sequential"] for r in rows},
                **{f"server_vs_engine_{r['clients']}": r["server_vs_engine"] for r in rows},
            },
        },
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
