"""The ladder of candidate shapes: the ones the scaling sweep trained and the sizer picks from.

Heads are 64 wide (the smallest shape has one); depth grows with width as in GPT-2's family, so
one number, the parameter count, orders them. `params` counts what the scaling rule is fitted
on: every weight but the input embedding table (the output head's matmul costs FLOPs like a
block's, a table lookup does not), as Kaplan et al. 2020 count non-embedding parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lmforge.model import ModelConfig


@dataclass(frozen=True)
class Shape:
    name: str
    d_model: int
    n_layers: int

    def model_config(self, base: ModelConfig) -> ModelConfig:
        """`base` (vocabulary, context, options) at this width and depth."""
        return replace(
            base, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.d_model // 64,
            n_kv_heads=None, d_ff=None,
        )  # fmt: skip

    def params(self, vocab_size: int) -> int:
        c = self.model_config(ModelConfig(vocab_size=vocab_size))
        d = c.d_model
        block = 4 * d * d + 3 * d * c.ffn_dim + 2 * d  # attention, SwiGLU MLP, two norms
        return c.n_layers * block + d + vocab_size * d  # + the final norm and output head

    def describe(self, vocab_size: int) -> str:
        return (
            f"{self.name}: {self.n_layers} layers, d_model {self.d_model}, "
            f"{self.d_model // 64} heads, {self.params(vocab_size) / 1e6:.1f}M parameters"
        )


LADDER = (
    Shape("d64-l2", 64, 2),
    Shape("d128-l4", 128, 4),
    Shape("d192-l4", 192, 4),
    Shape("d256-l4", 256, 4),
    Shape("d384-l6", 384, 6),
    Shape("d512-l8", 512, 8),
)


def shape(name: str) -> Shape:
    return next(s for s in LADDER if s.name == name)
