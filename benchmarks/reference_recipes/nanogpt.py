"""nanoGPT's model and train.py recipe at the shape its README gives a CPU (karpathy/nanoGPT at
3adf61e, read from model.py, train.py, config/train_shakespeare_char.py and README.md).

The recipe is the README's "I only have a macbook" command line: config/train_shakespeare_char.py
with `--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64
--batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
--dropout=0.0`. What it keeps, each as the source has it:

- model.py: GPT-2 blocks, pre-norm (`x + attn(ln_1(x))`, `x + mlp(ln_2(x))`); learned position
  embeddings added to the token embeddings; LayerNorm (eps 1e-5) with a weight and, as train.py
  defaults to `bias = False`, no bias, and no bias in any Linear either; fused q/k/v projection
  and causal scaled-dot-product attention; MLP of width 4·n_embd with exact GELU; a final
  LayerNorm; the output head tied to the token embedding; N(0, 0.02) init for every Linear and
  Embedding, the residual projections (`c_proj`) N(0, 0.02/sqrt(2·n_layer)); dropout 0.0 (the
  command line's, so no dropout layers run).
- shape: n_layer 4, n_head 4, n_embd 128, block_size 64, batch_size 12,
  gradient_accumulation_steps 1 (the config's); the vocabulary is the data's (nanoGPT reads it
  from meta.pkl; 4096 here, already a multiple of 64).
- optimizer (model.py configure_optimizers): torch.optim.AdamW, not fused (fused only on CUDA),
  lr 1e-3, betas (0.9, 0.99) (beta2 from the config), weight decay 0.1 on every parameter of
  2 or more dimensions and 0 on the rest; gradients clipped to norm 1.0.
- schedule (train.py get_lr): linear warmup over warmup_iters 100 as lr·(it+1)/(warmup+1),
  cosine from lr to min_lr 1e-4 (lr/10) at lr_decay_iters, min_lr after; lr_decay_iters =
  max_iters; the loop runs iterations 0 to max_iters inclusive, as train.py's
  `if iter_num > max_iters: break` does.
- seed: torch.manual_seed(1337), plus the benchmark's repetition number so reps differ.

What it leaves out or changes:

- max_iters: the command line's 2000 becomes what fits the wall-clock budget at the speed of
  the first iterations (bench_recipe.py times 5 after 2 untimed; see `set_iterations`), as a user
  fitting the README's command to a budget would; the run stops at max_iters or the budget.
- precision: on a CPU train.py runs fp32 (`ctx = nullcontext()`); here it runs the benchmark's
  one precision for both references (bf16 autocast where lmforge measures bf16 fast).
- data: lmforge's prepared token shards instead of shakespeare_char, sampled exactly as
  get_batch samples (random windows of the flat stream).
- the periodic estimate_loss (eval_interval 250, eval_iters 20), checkpointing, logging, MFU,
  DDP, GradScaler (fp16 only), torch.compile (off on a CPU anyway), generate and from_pretrained.
- forward returns logits at every position (nanoGPT's returns the last one without targets);
  the loss is the same cross-entropy over all positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import autocast


@dataclass
class Shape:
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64
    vocab_size: int = 4096


@dataclass
class Hyper:
    batch_size: int = 12
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    max_iters: int = 2000  # the README's; replaced by what fits the budget
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    seed: int = 1337


class LayerNorm(nn.Module):
    """LayerNorm with a weight and an optional bias (torch's cannot drop the bias alone)."""

    def __init__(self, dim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Attention(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.n_head = s.n_head
        self.c_attn = nn.Linear(s.n_embd, 3 * s.n_embd, bias=False)
        self.c_proj = nn.Linear(s.n_embd, s.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        heads = [
            z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
            for z in self.c_attn(x).split(c, dim=2)
        ]
        y = F.scaled_dot_product_attention(*heads, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(s.n_embd, bias=False)
        self.attn = Attention(s)
        self.ln_2 = LayerNorm(s.n_embd, bias=False)
        self.c_fc = nn.Linear(s.n_embd, 4 * s.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * s.n_embd, s.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.shape = s
        self.wte = nn.Embedding(s.vocab_size, s.n_embd)
        self.wpe = nn.Embedding(s.block_size, s.n_embd)
        self.h = nn.ModuleList(Block(s) for _ in range(s.n_layer))
        self.ln_f = LayerNorm(s.n_embd, bias=False)
        self.lm_head = nn.Linear(s.n_embd, s.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # tied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * s.n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def lr_at(it: int, h: Hyper, decay_iters: int) -> float:
    """train.py get_lr: linear warmup, cosine to min_lr at decay_iters, min_lr after."""
    if it < h.warmup_iters:
        return h.learning_rate * (it + 1) / (h.warmup_iters + 1)
    if it > decay_iters:
        return h.min_lr
    ratio = (it - h.warmup_iters) / (decay_iters - h.warmup_iters)
    return h.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (h.learning_rate - h.min_lr)


class Run:
    name = "nanoGPT"

    def __init__(self, shape: Shape, hyper: Hyper, dtype: torch.dtype | None = None) -> None:
        torch.manual_seed(hyper.seed)
        self.hyper, self.dtype = hyper, dtype
        self.model = GPT(shape)
        self.context, self.batch_size = shape.block_size, hyper.batch_size
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": hyper.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        self.optimizer = torch.optim.AdamW(groups, lr=hyper.learning_rate, betas=hyper.betas)
        self.max_iters = hyper.max_iters

    def set_iterations(self, n: int) -> None:
        """Train n steps: max_iters = lr_decay_iters = n - 1 (train.py runs 0..max_iters)."""
        self.max_iters = max(n - 1, 0)

    @property
    def iterations(self) -> int:
        return self.max_iters + 1

    def describe(self) -> dict:
        s = self.model.shape
        return {
            "n_layer": s.n_layer,
            "n_head": s.n_head,
            "n_embd": s.n_embd,
            "block_size": s.block_size,
            "batch_size": self.batch_size,
            "max_iters": self.max_iters,
            "precision": "bf16" if self.dtype else "fp32",
        }

    def step(self, it: int, batch) -> float:
        lr = lr_at(it, self.hyper, self.max_iters)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = batch()
        with autocast(self.dtype):
            logits = self.model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.hyper.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def build(vocab_size: int, seed: int = 0, dtype: torch.dtype | None = None, **shape) -> Run:
    """The README's CPU recipe for `vocab_size`; `shape` overrides (tests build tiny ones)."""
    return Run(Shape(vocab_size=vocab_size, **shape), Hyper(seed=1337 + seed), dtype)
