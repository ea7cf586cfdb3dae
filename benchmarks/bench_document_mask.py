"""The cost of document masking: training tokens/s of the speedrun shape, causal vs masked.

Both sides train the `small` preset's model (4 layers, d 256) on identical batches of 16 × 256
tokens with AdamW, one process, fp32; the masked side also passes each row's segment ids, so
attention runs through SDPA with an explicit (B, 1, T, T) mask instead of `is_causal`.
Documents are cut at random with a mean length of 256 tokens (stdlib files are longer: this is
the harder case) and of 64 (very short documents). Interleaved repetitions, medians.
Target: masked tokens/s within 15 % of causal-only. Writes benchmarks/results/document_mask.json.

    python benchmarks/bench_document_mask.py [--reps 5] [--steps 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lmforge.atomic import write_json
from lmforge.config import small
from lmforge.device.cpuinfo import cpu_class, read_cpuinfo
from lmforge.model import Transformer

RESULTS = Path(__file__).parent / "results" / "document_mask.json"
BATCH, SEQ = 16, 256


def segments_for(mean_length: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.rand(BATCH, SEQ, generator=generator) < 1 / mean_length
    starts[:, 0] = False
    return starts.cumsum(dim=1).to(torch.int32)


def steps_per_s(model, optimizer, x, y, segments, steps: int) -> float:
    kwargs = {} if segments is None else {"segments": segments}
    start = time.perf_counter()
    for _ in range(steps):
        logits = model(x, **kwargs)
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    config = small().model
    model = Transformer(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, config.vocab_size, (BATCH, SEQ))
    y = torch.randint(0, config.vocab_size, (BATCH, SEQ))
    sides = {"causal": None, "docs~256": segments_for(256, generator)}
    sides["docs~64"] = segments_for(64, generator)
    steps_per_s(model, optimizer, x, y, None, 1)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.reps):
        for name, segments in sides.items():
            rates[name].append(steps_per_s(model, optimizer, x, y, segments, args.steps))
    causal = statistics.median(rates["causal"]) * BATCH * SEQ
    rows = []
    print(f"{'side':<10} {'tokens/s':>9} {'vs causal':>10}")
    for name, values in rates.items():
        tokens = statistics.median(values) * BATCH * SEQ
        rows.append({"side": name, "tokens_per_s": round(tokens, 1), "ratio": tokens / causal})
        print(f"{name:<10} {tokens:>9.0f} {tokens / causal:>9.2f}x")
    worst = min(r["ratio"] for r in rows if r["side"] != "causal")
    print(
        f"target: masked >= 0.85x causal; worst {worst:.2f}x: "
        f"{'met' if worst >= 0.85 else 'NOT met'}"
    )
    info = read_cpuinfo()
    out = {"cpu": f"{info.model} ({cpu_class(info)})", "threads": torch.get_num_threads(),
           "batch": BATCH, "seq_len": SEQ, "reps": args.reps, "rows": rows}  # fmt: skip
    write_json(RESULTS, out)


if __name__ == "__main__":
    main()
