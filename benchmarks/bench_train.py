"""Training throughput: lmforge against the classic nanoGPT setup, side by side in one run.

The reference is nanoGPT's model.py with GPT-2's architecture (learned positions, LayerNorm and
Linear with biases, GELU MLP of width 4·n_embd, tied embeddings), trained as nanoGPT's train.py
does a character-level run: torch.optim.AdamW (not fused, as nanoGPT does on a CPU), clipping,
one thread, no compile. (train.py itself defaults to bias=False; that reference is about 1%
faster here.) lmforge trains its own Llama-style model through its real training step
(lmforge.train.step.train_step), at the same shape: n_layer=4, n_head=4, n_embd=128, block 256,
batch 16, a 65-symbol vocabulary, eager and with `--compile` (torch.compile per block). lmforge's
composition for a CPU run sets glibc to keep freed memory (lmforge.train.compose.
keep_freed_memory); that is process-wide, so the reference runs with it too (it does not change
the reference's speed: its allocations never made glibc trim the heap).

The two models are not the same size: lmforge's default SwiGLU width (8/3·n_embd rounded up to
a multiple of 64: 384) gives 3·128·384 MLP weights per block against nanoGPT's 2·128·512, so
lmforge does about 6% more FLOPs per token. Tokens/s therefore compares the models as their
users get them, and MFU (each model's own analytic FLOPs per token, nanoGPT's estimate_mfu
formula for both: 6 per weight plus 12·layers·n_embd·block for attention) compares how well
each uses the machine; the ratio `lmforge_fp32_vs_nanogpt_fp32_mfu` is the tokens/s ratio at
equal work.

Reported per (implementation, precision): tokens/s (median of interleaved repetitions), MFU
against this CPU's matmul peak in that precision (measured here), and the validation loss both
reach after the same number of steps on the same batches. Writes benchmarks/results/train.json.

    python benchmarks/bench_train.py [--steps 200] [--reps 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.data.documents import stdlib_root
from lmforge.device.peak import measure_matmul_flops
from lmforge.model import ModelConfig, Transformer
from lmforge.train.compose import compose
from lmforge.train.guard import NonFiniteGuard
from lmforge.train.optimizers import build_optimizer
from lmforge.train.precision import make_precision
from lmforge.train.schedule import lr_at
from lmforge.train.step import train_step

VOCAB, N_LAYER, N_HEAD, N_EMBD, BLOCK, BATCH = 65, 4, 4, 128, 256, 16
LR, MIN_LR, WARMUP, BETAS, WEIGHT_DECAY, CLIP = 1e-3, 1e-4, 20, (0.9, 0.99), 0.1, 1.0
RESULTS = Path(__file__).parent / "results" / "train.json"


# ---- the reference: nanoGPT's model.py, as it trains a character-level model -----------------


class CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        q, k, v = (z.view(b, t, N_HEAD, c // N_HEAD).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_fc = nn.Linear(N_EMBD, 4 * N_EMBD)
        self.c_proj = nn.Linear(4 * N_EMBD, N_EMBD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(N_EMBD), CausalSelfAttention()
        self.ln_2, self.mlp = nn.LayerNorm(N_EMBD), MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, N_EMBD), nn.Embedding(BLOCK, N_EMBD)
        self.h = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * N_LAYER))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def flops_per_token(self) -> float:
        """nanoGPT's estimate_mfu: 6N + 12·L·H·Q·T, N without the position table."""
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6.0 * n + 12.0 * N_LAYER * N_EMBD * BLOCK


class Reference:
    """nanoGPT's training step: autocast context, AdamW with decay on 2-D weights, clipping."""

    def __init__(self, precision: str) -> None:
        torch.manual_seed(0)
        self.model = GPT()
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        self.optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS)
        self.dtype = torch.bfloat16 if precision == "bf16" else None
        self.flops_per_token = self.model.flops_per_token()

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> torch.Tensor:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype is not None):
            logits = self.model(x)
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def eval_model(self) -> nn.Module:
        return self.model


# ---- lmforge: its model through its training step ----------------------------------------------


class Lmforge:
    def __init__(self, precision: str, compile: bool = False) -> None:
        torch.manual_seed(0)
        device = torch.device("cpu")
        config = ModelConfig(
            vocab_size=VOCAB, d_model=N_EMBD, n_layers=N_LAYER, n_heads=N_HEAD, max_seq_len=BLOCK
        )
        self.model = Transformer(config)
        self.optimizer = build_optimizer(self.model, LR, BETAS, WEIGHT_DECAY)
        self.composed = compose(
            self.model, make_precision(precision, device), device, compile=compile
        )
        self.guard = NonFiniteGuard(device, max_bad_steps=10**9)
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None
        self.flops_per_token = self.model.flops_per_token(BLOCK)

    def next(self, step: int, micro: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        return self.batch

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> torch.Tensor:
        self.batch = (x, y)
        out = train_step(
            self.composed, self.optimizer, self.guard, self, 0, lr, 1, CLIP, torch.device("cpu")
        )
        return out.loss

    def eval_model(self) -> nn.Module:
        return self.model


# ---- data, timing, quality --------------------------------------------------------------------


def char_tokens(n_chars: int = 4_000_000) -> torch.Tensor:
    """The standard library's source as characters, the 64 most common kept, the rest one id."""
    text, total = [], 0
    for path in sorted(stdlib_root().glob("*.py")):
        t = path.read_text(encoding="utf-8", errors="ignore")
        text.append(t)
        total += len(t)
        if total >= n_chars:
            break
    text = "".join(text)[:n_chars]
    common = [c for c, _ in collections.Counter(text).most_common(VOCAB - 1)]
    ids = {c: i for i, c in enumerate(common)}
    return torch.tensor([ids.get(c, VOCAB - 1) for c in text], dtype=torch.int64)


def batch(data: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - BLOCK - 1, (BATCH,), generator=g)
    window = torch.stack([data[s : s + BLOCK + 1] for s in starts.tolist()])
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def time_steps(trainer, data: torch.Tensor, steps: int, warmup: int = 1) -> list[float]:
    """Seconds of each of `steps` steps after `warmup` untimed ones."""
    times = []
    for i in range(warmup + steps):
        x, y = batch(data, 10_000 + i)
        t0 = time.perf_counter()
        float(trainer.step(x, y, LR))
        times.append(time.perf_counter() - t0)
    return times[warmup:]


@torch.no_grad()
def val_loss(model: nn.Module, val: torch.Tensor, batches: int = 8) -> float:
    model.eval()
    losses = [
        F.cross_entropy(model(x).float().view(-1, VOCAB), y.view(-1)).item()
        for x, y in (batch(val, 1_000_000 + i) for i in range(batches))
    ]
    model.train()
    return sum(losses) / len(losses)


def train_for(trainer, data: torch.Tensor, val: torch.Tensor, steps: int) -> float:
    for step in range(steps):
        x, y = batch(data, step)
        trainer.step(x, y, lr_at(step, LR, MIN_LR, WARMUP, steps))
    return val_loss(trainer.eval_model(), val)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps for the loss check")
    parser.add_argument("--reps", type=int, default=8, help="timing repetitions, interleaved")
    parser.add_argument("--timed-steps", type=int, default=5, help="steps per repetition")
    args = parser.parse_args()
    torch.set_num_threads(1)

    tokens = char_tokens()
    split = int(0.95 * len(tokens))
    data, val = tokens[:split], tokens[split:]
    peaks = {d: measure_matmul_flops("cpu", d, seconds=2.0) for d in ("fp32", "bf16")}
    print(
        f"one thread: fp32 matmul peak {peaks['fp32'] / 1e9:.0f} GFLOP/s, "
        f"bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s ({peaks['bf16'] / peaks['fp32']:.2f}x)"
    )

    impls = ("nanoGPT", "lmforge", "lmforge --compile")
    configs = [(impl, p) for p in ("fp32", "bf16") for impl in impls]
    make = {
        "nanoGPT": Reference,
        "lmforge": Lmforge,
        "lmforge --compile": lambda p: Lmforge(p, compile=True),
    }
    trainers = {c: make[c[0]](c[1]) for c in configs}
    for c in configs:  # one-off costs (compilation, kernel selection) before any timing
        time_steps(trainers[c], data, 2)
    seconds: dict[tuple[str, str], list[float]] = {c: [] for c in configs}
    for rep in range(args.reps):
        for c in configs:
            seconds[c] += time_steps(trainers[c], data, args.timed_steps)
        print(f"repetition {rep + 1}/{args.reps} done")

    rows = []
    for impl, precision in configs:
        step_s = statistics.median(seconds[impl, precision])
        trainer = make[impl](precision)  # fresh weights for the loss check
        loss = train_for(trainer, data, val, args.steps)
        tokens_per_s = BATCH * BLOCK / step_s
        rows.append(
            {
                "impl": impl,
                "precision": precision,
                "tokens_per_s": round(tokens_per_s),
                "tokens_per_s_best": round(BATCH * BLOCK / min(seconds[impl, precision])),
                "step_ms": round(step_s * 1000, 1),
                "step_ms_all": [round(t * 1000, 1) for t in seconds[impl, precision]],
                "flops_per_token": trainer.flops_per_token,
                "mfu": round(trainer.flops_per_token * tokens_per_s / peaks[precision], 4),
                "val_loss": round(loss, 4),
            }
        )
        print(f"{impl} {precision}: {rows[-1]['tokens_per_s']} tok/s, val loss {loss:.4f}")

    by = {(r["impl"], r["precision"]): r for r in rows}
    base = by["nanoGPT", "fp32"]
    ratios = {
        "lmforge_fp32_vs_nanogpt_fp32_tokens_per_s": by["lmforge", "fp32"]["tokens_per_s"]
        / base["tokens_per_s"],
        "lmforge_bf16_vs_nanogpt_fp32_tokens_per_s": by["lmforge", "bf16"]["tokens_per_s"]
        / base["tokens_per_s"],
        "lmforge_bf16_vs_lmforge_fp32_tokens_per_s": by["lmforge", "bf16"]["tokens_per_s"]
        / by["lmforge", "fp32"]["tokens_per_s"],
        "lmforge_bf16_vs_nanogpt_fp32_val_loss": by["lmforge", "bf16"]["val_loss"]
        / base["val_loss"],
        "lmforge_bf16_vs_lmforge_fp32_val_loss": by["lmforge", "bf16"]["val_loss"]
        / by["lmforge", "fp32"]["val_loss"],
        "lmforge_compile_fp32_vs_nanogpt_fp32_tokens_per_s": by["lmforge --compile", "fp32"][
            "tokens_per_s"
        ]
        / base["tokens_per_s"],
        "lmforge_compile_bf16_vs_nanogpt_fp32_tokens_per_s": by["lmforge --compile", "bf16"][
            "tokens_per_s"
        ]
        / base["tokens_per_s"],
        "lmforge_vs_nanogpt_flops_per_token": by["lmforge", "fp32"]["flops_per_token"]
        / base["flops_per_token"],
        "lmforge_fp32_vs_nanogpt_fp32_mfu": by["lmforge", "fp32"]["mfu"] / base["mfu"],
        "lmforge_compile_fp32_vs_nanogpt_fp32_mfu": by["lmforge --compile", "fp32"]["mfu"]
        / base["mfu"],
    }
    print()
    print(
        "| implementation | precision | tokens/s (median) | tokens/s (best) | ms/step | MFU "
        f"| val loss after {args.steps} steps |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['impl']} | {r['precision']} | {r['tokens_per_s']:,} | "
            f"{r['tokens_per_s_best']:,} | {r['step_ms']} | {r['mfu']:.1%} | {r['val_loss']:.4f} |"
        )
    print()
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "shape": {
                    "n_layer": N_LAYER,
                    "n_head": N_HEAD,
                    "n_embd": N_EMBD,
                    "block": BLOCK,
                    "batch": BATCH,
                    "vocab": VOCAB,
                },
                "threads": 1,
                "steps_for_loss": args.steps,
                "repetitions": args.reps,
                "cpu": platform.processor() or platform.machine(),
                "torch": torch.__version__,
                "peak_flops": peaks,
                "rows": rows,
                "ratios": {k: round(v, 3) for k, v in ratios.items()},
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
