"""nanochat's GPT and base_train.py recipe, Muon + AdamW (karpathy/nanochat at 92d63d4, read
from nanochat/gpt.py, nanochat/optim.py, scripts/base_train.py and runs/runcpu.sh).

At this commit nanochat has no nanochat/muon.py: Muon and AdamW are one MuonAdamW in
nanochat/optim.py, and Muon's orthogonalisation is Polar Express (five per-iteration
coefficient triples) rather than the fixed quintic Newton-Schulz of nanochat's first release.

The starting point is nanochat's own CPU run, runs/runcpu.sh: `base_train --depth=6
--head-dim=64 --window-pattern=L --max-seq-len=512 --device-batch-size=32
--total-batch-size=16384 --num-iterations=5000`, everything else base_train.py's defaults.
What it keeps, each as the source has it:

- gpt.py, model: token embedding, then a parameter-free RMSNorm (F.rms_norm, no weight) before
  and after every sub-layer's input and at the end; "smear" (a sigmoid gate on the first 24
  channels mixes the previous position's embedding in, times a learnt scalar starting at 0);
  per-layer learnt scalars resid_lambdas (init 1.15 falling to 1.05 over depth) and x0_lambdas
  (0.20 falling to 0.05) blending the residual stream with the initial embedding; value
  embeddings on alternating layers, the last always included, added to v through a gate
  3·sigmoid(W·x[:12]) per head; rotary embeddings (base 100000, nanochat's sign convention)
  and then QK-norm, q and k each scaled by 1.2; causal attention, full context (runcpu's
  window pattern L); relu² MLP of width 4·n_embd; no biases anywhere; "backout" (the residual
  after layer n_layer//2, times a learnt 0.2, subtracted before the final norm); an untied
  output head; logits softcapped as 15·tanh(logits/15) in fp32.
- gpt.py init_weights: wte N(0, 0.8), lm_head N(0, 0.001); q, k, v uniform with std
  1/sqrt(n_embd), c_fc at 0.4 times that, both output projections zero; value embeddings as
  c_v; smear and value-embedding gates uniform(0, 0.02).
- base_train.py, depth → width: model_dim = depth·aspect_ratio (64), rounded up to a multiple
  of head_dim (64 from runcpu.sh), heads = model_dim/head_dim, kv heads = heads.
- base_train.py, horizon and scaling: the scaling parameters are the transformer matrices plus
  the head; target tokens = target_param_data_ratio (its default 12) times those; the batch is
  runcpu.sh's 16384 tokens (32 × 512, no accumulation), so every learning rate is scaled by
  sqrt(16384/2^19) and Muon's weight decay 0.28 by sqrt(16384/2^19)·(D_ref/target tokens),
  D_ref being 12 times the scaling parameters of the same family at depth 12.
- gpt.py setup_optimizer and optim.py, AdamW groups (decoupled decay, bias-corrected, eps 1e-10;
  torch.optim.AdamW computes exactly optim.py's adamw_step_fused): lm_head lr 0.008,
  betas (0.8, 0.96), decay 0.01; wte lr 0.3, betas (0.8, 0.995), decay 0.001; value embeddings
  lr 0.15, betas (0.8, 0.995), decay 0.01 (these three times (n_embd/768)^-0.5); resid_lambdas
  lr 0.005, betas (0.8, 0.95), decay 0.05; x0_lambdas lr 0.5, betas (0.96, 0.95); smear gate,
  smear and backout scalars lr 0.2 (not batch-scaled), betas (0.8, 0.95).
- optim.py, Muon on every parameter of the blocks, stacked by shape: lr 0.02, Nesterov momentum,
  MuonEq row equilibration, Frobenius normalisation (·1.01), five Polar Express iterations (in
  bf16 when the run computes in bf16), Muon+ renormalisation to sqrt(min(m, n)), NorMuon
  variance reduction (beta2 0.9, per row or column), lr times max(1, rows/cols)^0.5, cautious
  weight decay (only where update and weight agree in sign).
- base_train.py schedules: lr multiplier (it+1)/40 for the first 40 steps, 1 until the last
  65 % (warmdown_ratio 0.65), then linear to final_lr_frac 0.05; Muon momentum 0.85 → 0.97 over
  the first 400 steps, then 0.97 → 0.90 over the warmdown; Muon weight decay cosine to 0 over
  the run. No gradient clipping.

What it leaves out or changes:

- depth: runcpu.sh's 6 (n_embd 384, 6 heads of 64), and num_iterations its 5000 becomes the
  step count that fits the budget at the measured speed of the run's first steps, as a
  runcpu.sh user sets --num-iterations. base_train.py still sizes Muon's weight decay from the
  depth's target tokens (its target_param_data_ratio times its scaling parameters), as it does
  when --num-iterations is given.
- batch size: base_train.py's own rule (2^19·(target/D_ref)^0.383, a power of two) would give
  about 2^17 tokens a step here, a few dozen steps in five minutes; runcpu.sh's 16384 is kept.
- precision: nanochat computes fp32 without CUDA (common.py COMPUTE_DTYPE); here it runs the
  benchmark's one precision for both references (bf16 autocast where lmforge measures bf16
  fast), weights in fp32 throughout (nanochat stores the embeddings in the compute dtype).
- data: random windows of lmforge's prepared token stream (nanoGPT's get_batch), not
  nanochat's BOS-aligned best-fit packing of whole documents.
- sliding-window attention (runcpu.sh turns it off), GQA (base_train.py sets kv heads = heads),
  FP8, torch.compile, the distributed sharding of MuonAdamW, periodic bpb/CORE evaluation,
  sampling, checkpointing, the KV cache and generation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import autocast

SOFTCAP = 15.0
B_REF = 2**19  # base_train.py: the optimal batch at depth 12, in tokens


@dataclass
class Shape:
    n_layer: int
    n_head: int
    n_embd: int
    sequence_len: int = 512
    vocab_size: int = 4096


def depth_shape(
    depth: int, vocab_size: int, aspect_ratio: int = 64, head_dim: int = 64, seq_len: int = 512
) -> Shape:
    """base_train.py build_model_meta: width from depth, rounded up to whole heads."""
    model_dim = -(-depth * aspect_ratio // head_dim) * head_dim
    return Shape(depth, model_dim // head_dim, model_dim, seq_len, vocab_size)


@dataclass
class Hyper:
    device_batch_size: int = 32
    total_batch_size: int = 16384
    target_param_data_ratio: float = 12.0
    embedding_lr: float = 0.3
    unembedding_lr: float = 0.008
    matrix_lr: float = 0.02
    scalar_lr: float = 0.5
    weight_decay: float = 0.28
    warmup_steps: int = 40
    warmdown_ratio: float = 0.65
    final_lr_frac: float = 0.05
    seed: int = 42


def norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


def has_value_embedding(layer: int, n_layer: int) -> bool:
    return layer % 2 == (n_layer - 1) % 2


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """nanochat's rotation of the two halves of each head (by -theta: only q·k matters)."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


class Attention(nn.Module):
    GATE_CHANNELS = 12

    def __init__(self, s: Shape, layer: int) -> None:
        super().__init__()
        self.n_head, self.head_dim = s.n_head, s.n_embd // s.n_head
        self.c_q = nn.Linear(s.n_embd, s.n_embd, bias=False)
        self.c_k = nn.Linear(s.n_embd, s.n_embd, bias=False)
        self.c_v = nn.Linear(s.n_embd, s.n_embd, bias=False)
        self.c_proj = nn.Linear(s.n_embd, s.n_embd, bias=False)
        self.ve_gate = (
            nn.Linear(self.GATE_CHANNELS, s.n_head, bias=False)
            if has_value_embedding(layer, s.n_layer)
            else None
        )

    def forward(self, x, ve, cos, sin):
        b, t, c = x.shape
        q = self.c_q(x).view(b, t, self.n_head, self.head_dim)
        k = self.c_k(x).view(b, t, self.n_head, self.head_dim)
        v = self.c_v(x).view(b, t, self.n_head, self.head_dim)
        if ve is not None:
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., : self.GATE_CHANNELS]))
            v = v + gate.unsqueeze(-1) * ve.view(b, t, self.n_head, self.head_dim)
        q, k = norm(rotary(q, cos, sin)) * 1.2, norm(rotary(k, cos, sin)) * 1.2
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.c_fc = nn.Linear(s.n_embd, 4 * s.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * s.n_embd, s.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, s: Shape, layer: int) -> None:
        super().__init__()
        self.attn = Attention(s, layer)
        self.mlp = MLP(s)

    def forward(self, x, ve, cos, sin):
        x = x + self.attn(norm(x), ve, cos, sin)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    SMEAR_CHANNELS = 24

    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.shape = s
        self.wte = nn.Embedding(s.vocab_size, s.n_embd)
        self.h = nn.ModuleList(Block(s, i) for i in range(s.n_layer))
        self.lm_head = nn.Linear(s.n_embd, s.vocab_size, bias=False)
        self.resid_lambdas = nn.Parameter(torch.ones(s.n_layer))
        self.x0_lambdas = nn.Parameter(torch.zeros(s.n_layer))
        self.smear_gate = nn.Linear(self.SMEAR_CHANNELS, 1, bias=False)
        self.smear_lambda = nn.Parameter(torch.zeros(1))
        self.backout_lambda = nn.Parameter(torch.full((1,), 0.2))
        self.value_embeds = nn.ModuleDict(
            {
                str(i): nn.Embedding(s.vocab_size, s.n_embd)
                for i in range(s.n_layer)
                if has_value_embedding(i, s.n_layer)
            }
        )
        head_dim = s.n_embd // s.n_head
        inv_freq = 1.0 / 100000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
        freqs = torch.outer(torch.arange(s.sequence_len).float(), inv_freq)
        self.register_buffer("cos", freqs.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", freqs.sin()[None, :, None, :], persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        s = self.shape
        nn.init.normal_(self.wte.weight, std=0.8)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        bound = 3**0.5 * s.n_embd**-0.5  # uniform with std 1/sqrt(n_embd)
        for block in self.h:
            for w in (block.attn.c_q, block.attn.c_k, block.attn.c_v):
                nn.init.uniform_(w.weight, -bound, bound)
            nn.init.zeros_(block.attn.c_proj.weight)
            nn.init.uniform_(block.mlp.c_fc.weight, -0.4 * bound, 0.4 * bound)
            nn.init.zeros_(block.mlp.c_proj.weight)
            if block.attn.ve_gate is not None:
                nn.init.uniform_(block.attn.ve_gate.weight, 0.0, 0.02)
        for i in range(s.n_layer):
            self.resid_lambdas[i] = 1.15 - 0.10 * i / max(s.n_layer - 1, 1)
            self.x0_lambdas[i] = 0.20 - 0.15 * i / max(s.n_layer - 1, 1)
        nn.init.zeros_(self.smear_lambda)
        nn.init.constant_(self.backout_lambda, 0.2)
        nn.init.uniform_(self.smear_gate.weight, 0.0, 0.02)
        for ve in self.value_embeds.values():
            nn.init.uniform_(ve.weight, -bound, bound)

    def scaling_params(self) -> int:
        """base_train.py get_scaling_params: transformer matrices plus the output head."""
        return sum(p.numel() for p in self.h.parameters()) + self.lm_head.weight.numel()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        cos, sin = self.cos[:, :t], self.sin[:, :t]
        x = norm(self.wte(idx))
        c = self.SMEAR_CHANNELS
        gate = self.smear_lambda * torch.sigmoid(self.smear_gate(x[:, 1:, :c]))
        x = torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)
        x0, backout = x, None
        for i, block in enumerate(self.h):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
            x = block(x, ve, cos, sin)
            if i == self.shape.n_layer // 2:
                backout = x
        x = norm(x - self.backout_lambda * backout)
        logits = self.lm_head(x).float()
        return SOFTCAP * torch.tanh(logits / SOFTCAP)


# ---- Muon (optim.py muon_step_fused), one stacked group of same-shape matrices ---------------

# Polar Express coefficients for 5 iterations (Amsel et al. 2025), as optim.py lists them.
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def orthogonalize(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32):
    """MuonEq row equilibration, Frobenius normalisation, then `steps` Polar Express
    iterations on the last two dims: approximately the orthogonal polar factor of g."""
    x = g.to(dtype)
    target = x.float().norm(dim=(-2, -1), keepdim=True) / x.size(-2) ** 0.5
    rows = x.float().norm(dim=-1, keepdim=True).clamp_min(1e-6)
    x = x * (target / rows).to(x.dtype)
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * 1.01 + 1e-6)
    tall = g.size(-2) > g.size(-1)
    for a, b, c in POLAR_EXPRESS[:steps]:
        if tall:
            m = x.mT @ x
            x = a * x + x @ (b * m + c * (m @ m))
        else:
            m = x @ x.mT
            x = a * x + (b * m + c * (m @ m)) @ x
    return x.to(g.dtype)


class Muon:
    """One shape's stacked parameters: optim.py's Muon step on a single rank."""

    def __init__(self, params: list[nn.Parameter], lr: float, ns_dtype: torch.dtype) -> None:
        self.params, self.lr, self.initial_lr, self.ns_dtype = params, lr, lr, ns_dtype
        self.momentum, self.weight_decay, self.beta2 = 0.95, 0.0, 0.9
        k, (rows, cols) = len(params), params[0].shape
        self.red_dim = -1 if rows >= cols else -2
        second = (k, rows, 1) if rows >= cols else (k, 1, cols)
        self.buffer = torch.zeros(k, rows, cols)
        self.second = torch.zeros(second)
        self.lr_scale = max(1.0, rows / cols) ** 0.5

    @torch.no_grad()
    def step(self) -> None:
        grads = torch.stack([p.grad for p in self.params])
        weights = torch.stack([p.detach() for p in self.params])
        self.buffer.lerp_(grads, 1 - self.momentum)
        g = grads.lerp_(self.buffer, self.momentum)  # Nesterov
        g = orthogonalize(g, 5, self.ns_dtype)
        target = min(g.size(-2), g.size(-1)) ** 0.5  # Muon+
        g = g * (target / g.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-6))
        # NorMuon: per-row (or per-column) second moment, the update's norm kept
        v_mean = g.square().mean(dim=self.red_dim, keepdim=True)
        size = g.size(self.red_dim)
        v_norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * size).sqrt()
        self.second.lerp_(v_mean, 1 - self.beta2)
        step = self.second.clamp_min(1e-10).rsqrt()
        v_norm_new = ((v_mean * size) * step.square()).sum(dim=(-2, -1), keepdim=True).sqrt()
        g = g * (step * (v_norm / v_norm_new.clamp_min(1e-10)))
        lr = self.lr * self.lr_scale
        mask = (g * weights) >= 0  # cautious weight decay
        weights.sub_(lr * g + lr * self.weight_decay * weights * mask)
        for p, w in zip(self.params, weights.unbind(0), strict=True):
            p.copy_(w)


# ---- the run: base_train.py's optimizer set-up, schedules and step ----------------------------


def reference_tokens(shape: Shape, h: Hyper) -> float:
    """D_ref: target tokens of the depth-12 model of the same family (base_train.py)."""
    with torch.device("meta"):
        d12 = GPT(depth_shape(12, shape.vocab_size, seq_len=shape.sequence_len))
    return h.target_param_data_ratio * d12.scaling_params()


class Run:
    name = "nanochat"

    def __init__(self, shape: Shape, hyper: Hyper, dtype: torch.dtype | None = None) -> None:
        torch.manual_seed(hyper.seed)
        self.hyper, self.dtype = hyper, dtype
        self.model = GPT(shape)
        self.context, self.batch_size = shape.sequence_len, hyper.device_batch_size
        tokens_per_fwdbwd = hyper.device_batch_size * shape.sequence_len
        assert hyper.total_batch_size % tokens_per_fwdbwd == 0
        self.accum = hyper.total_batch_size // tokens_per_fwdbwd
        self.target_tokens = int(hyper.target_param_data_ratio * self.model.scaling_params())
        batch_lr_scale = (hyper.total_batch_size / B_REF) ** 0.5
        wd_scale = batch_lr_scale * reference_tokens(shape, hyper) / self.target_tokens
        self.weight_decay = hyper.weight_decay * wd_scale
        self.iterations = max(self.target_tokens // hyper.total_batch_size, 1)
        self.adamw, self.muon = self._optimizers(batch_lr_scale)

    def _optimizers(self, scale: float) -> tuple[torch.optim.AdamW, list[Muon]]:
        m, h = self.model, self.hyper
        dmodel = (m.shape.n_embd / 768) ** -0.5
        embedding_lr = h.embedding_lr * scale * dmodel
        adam = [
            (m.lm_head.parameters(), h.unembedding_lr * scale * dmodel, (0.8, 0.96), 0.01),
            (m.wte.parameters(), embedding_lr, (0.8, 0.995), 0.001),
            (m.value_embeds.parameters(), embedding_lr * 0.5, (0.8, 0.995), 0.01),
            ([m.resid_lambdas], h.scalar_lr * scale * 0.01, (0.8, 0.95), 0.05),
            ([m.x0_lambdas], h.scalar_lr * scale, (0.96, 0.95), 0.0),
            ([m.smear_gate.weight, m.smear_lambda, m.backout_lambda], 0.2, (0.8, 0.95), 0.0),
        ]
        groups = [
            {"params": list(p), "lr": lr, "initial_lr": lr, "betas": b, "weight_decay": wd}
            for p, lr, b, wd in adam
        ]
        groups = [g for g in groups if g["params"]]
        adamw = torch.optim.AdamW(groups, eps=1e-10)
        matrices = list(m.h.parameters())
        ns_dtype = self.dtype or torch.float32
        muon = [
            Muon([p for p in matrices if p.shape == shape], h.matrix_lr * scale, ns_dtype)
            for shape in sorted({p.shape for p in matrices})
        ]
        counted = sum(len(g["params"]) for g in groups) + sum(len(g.params) for g in muon)
        assert counted == len(list(m.parameters()))
        return adamw, muon

    def set_iterations(self, n: int) -> None:
        self.iterations = max(n, 1)

    def describe(self) -> dict:
        s = self.model.shape
        return {
            "depth": s.n_layer,
            "n_embd": s.n_embd,
            "n_head": s.n_head,
            "sequence_len": s.sequence_len,
            "total_batch_size": self.hyper.total_batch_size,
            "scaling_params": self.model.scaling_params(),
            "target_tokens": self.target_tokens,
            "num_iterations": self.iterations,
            "muon_weight_decay": round(self.weight_decay, 4),
            "precision": "bf16" if self.dtype else "fp32",
        }

    # base_train.py get_lr_multiplier, get_muon_momentum, get_weight_decay
    def lr_multiplier(self, it: int) -> float:
        h, n = self.hyper, self.iterations
        warmdown = round(h.warmdown_ratio * n)
        if it < h.warmup_steps:
            return (it + 1) / h.warmup_steps
        if it <= n - warmdown:
            return 1.0
        progress = (n - it) / warmdown
        return progress + (1 - progress) * h.final_lr_frac

    def muon_momentum(self, it: int) -> float:
        n = self.iterations
        warmdown = round(self.hyper.warmdown_ratio * n)
        start = n - warmdown
        if it < 400:
            frac = it / 400
            return (1 - frac) * 0.85 + frac * 0.97
        if it >= start:
            progress = (it - start) / warmdown
            return 0.97 * (1 - progress) + 0.90 * progress
        return 0.97

    def muon_weight_decay(self, it: int) -> float:
        return self.weight_decay * 0.5 * (1 + math.cos(math.pi * it / self.iterations))

    def step(self, it: int, batch) -> float:
        total = 0.0
        for _ in range(self.accum):
            x, y = batch()
            with autocast(self.dtype):
                logits = self.model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            (loss / self.accum).backward()
            total += loss.item() / self.accum
        lrm = self.lr_multiplier(it)
        for group in self.adamw.param_groups:
            group["lr"] = group["initial_lr"] * lrm
        self.adamw.step()
        for group in self.muon:
            group.lr = group.initial_lr * lrm
            group.momentum = self.muon_momentum(it)
            group.weight_decay = self.muon_weight_decay(it)
            group.step()
        self.model.zero_grad(set_to_none=True)
        return total


def build(
    vocab_size: int, seed: int = 0, dtype: torch.dtype | None = None, depth: int = 6, **shape
) -> Run:
    """base_train.py at `depth` with runcpu.sh's settings; `shape` overrides (tests)."""
    s = depth_shape(depth, vocab_size)
    for key, value in shape.items():
        setattr(s, key, value)
    return Run(s, Hyper(seed=42 + seed), dtype)
