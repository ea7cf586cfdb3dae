"""The Llama-style decoder: the Transformer built from a ModelConfig (model/config.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.kernels.linear_cross_entropy import linear_cross_entropy
from lmforge.model.attention import Attention, segment_positions
from lmforge.model.config import ModelConfig
from lmforge.model.layers import Embedding, Linear, RMSNorm, SwiGLU
from lmforge.model.moe import MoE
from lmforge.model.rope import RotaryEmbedding

if TYPE_CHECKING:
    from lmforge.model.cache import Cache


class Block(nn.Module):
    """One pre-norm residual block: x + attn(norm x), then x + mlp(norm x)."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config.d_model, config.n_heads, config.kv_heads, layer_idx)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        if config.n_experts:
            self.mlp = MoE.from_config(config)
        else:
            self.mlp = SwiGLU(config.d_model, config.ffn_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: Cache | None = None,
        segments: torch.Tensor | None = None,
        branches: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, kv_cache, segments, branches)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Token embedding, n_layers blocks, a final RMSNorm and the output head.

    `head_loss` is how forward(targets=...) fuses the head into the cross-entropy: PyTorch's
    chunked kernel here; a kernel choice (lmforge.train.kernel_choice) may set another on a model.
    """

    head_loss = staticmethod(linear_cross_entropy)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.tok_embeddings = Embedding(config.vocab_size, config.d_model)
        self.rope = RotaryEmbedding(config.head_dim, config.max_seq_len, config.rope_theta)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.output = Linear(config.d_model, config.vocab_size)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(
        self,
        ids: torch.Tensor,
        kv_cache: Cache | None = None,
        last_only: bool = False,
        logits_at: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        branches: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, vocab_size) for token ids (B, T), continuing kv_cache if given.

        last_only computes logits for the last position alone (B, 1, vocab_size), as generation
        needs after a prefill; logits_at (B,) for one position of each row (B, 1, vocab_size),
        as scoring right-padded rows needs, or (B, N) for N positions of each (B, N, vocab_size).
        segments (B, T) numbers the documents packed in each row: attention and positions then
        stay inside each document, so every one computes as if it were alone (packed pretraining
        and conversations; with RoPE, restarting positions changes nothing, since attention
        inside a document sees only relative offsets). branches (B, T) makes each document a
        trunk (branch 0, first) and branches that each continue it alone (`segment_positions`):
        a row then holds a context and all its continuations; with a kv_cache, branches alone
        make the new tokens such a tree continuing what the cache holds (scoring continuations
        of a cached context). With targets (B, T) it returns
        their mean cross-entropy (-100: no loss) instead, from the head and loss fused chunk by
        chunk, so the (B·T, vocab) logits never exist at once.
        """
        b, t = ids.shape
        start = 0 if kv_cache is None else kv_cache.pos  # an int, or per-row LongTensor (B,)
        if kv_cache is not None and segments is not None:
            raise LmforgeError("packed documents (segments) are for training: pass no kv_cache")
        if branches is not None and kv_cache is None and segments is None:
            segments = torch.zeros_like(branches)
        unpacked = segments is None and branches is None
        if unpacked and isinstance(start, int) and start + t > self.config.max_seq_len:
            raise LmforgeError(
                f"sequence of {start + t} tokens exceeds model.max_seq_len="
                f"{self.config.max_seq_len}: pass shorter inputs or raise max_seq_len"
            )
        if kv_cache is not None:
            kv_cache.check_fits(b, t)
        h = self.tok_embeddings(ids)
        if segments is not None:
            cos, sin = self.rope.at(self._packed_positions(segments, branches))
        elif branches is not None:  # a tree after the cache: positions from its first new key
            first = start[:, None] if isinstance(start, torch.Tensor) else start
            cos, sin = self.rope.at(first + segment_positions(torch.zeros_like(branches), branches))
        else:
            cos, sin = self.rope(start, t)
        for layer in self.layers:
            h = layer(h, cos, sin, kv_cache, segments, branches)
        if logits_at is not None:
            rows = torch.arange(b, device=h.device)[:, None]
            h = h[rows, logits_at[:, None] if logits_at.dim() == 1 else logits_at]
        elif last_only:
            h = h[:, -1:]
        if targets is not None:
            h = self.norm(h).flatten(0, 1)
            return self.head_loss(h, self.output.weight, targets.flatten())
        logits = self.output(self.norm(h))
        if kv_cache is not None:
            kv_cache.advance(t)  # only now: every layer wrote its K/V at the same position
        return logits

    def _packed_positions(
        self, segments: torch.Tensor, branches: torch.Tensor | None
    ) -> torch.Tensor:
        """Each packed token's position in its own document; a row may be longer than the
        context window (a context and its continuations), its documents' positions not."""
        positions = segment_positions(segments, branches)
        if segments.shape[1] > self.config.max_seq_len:
            last = int(positions.max())
            if last >= self.config.max_seq_len:
                raise LmforgeError(
                    f"a packed document reaches position {last}, past model.max_seq_len="
                    f"{self.config.max_seq_len}: pack shorter documents"
                )
        return positions

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Parameter count (every expert of a MoE); exclude_embeddings drops the input lookup
        table. A tied output head shares that table and still counts, since its matmul costs FLOPs.
        """
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings and not self.config.tie_embeddings:
            n -= self.tok_embeddings.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per active weight plus attention's 12 · layers · d_model · T.

        Active: a MoE token runs experts_per_token of the n_experts experts of each block."""
        c = self.config
        n = self.num_params(exclude_embeddings=True)
        if c.n_experts:
            idle_expert = 3 * c.d_model * c.expert_ffn_dim
            n -= c.n_layers * (c.n_experts - c.experts_per_token) * idle_expert
        return 6.0 * n + 12.0 * c.n_layers * c.d_model * seq_len
