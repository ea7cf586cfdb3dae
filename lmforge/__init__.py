"""lmforge: a complete large-language-model system, from raw documents to a served model."""

from __future__ import annotations

__version__ = "0.1.0"


def load(checkpoint_dir: str, device: str = "cpu"):
    """`(model, tokenizer)` from a checkpoint folder (or a run folder: its newest checkpoint),
    float or quantized by `lmforge quantize` (its int8/int4 layers then decode from their codes).

    `model(ids)` maps a LongTensor (batch, seq) to logits (batch, seq, vocab).
    """
    from lmforge.quant.checkpoint import load_any_checkpoint

    return load_any_checkpoint(checkpoint_dir, device)
