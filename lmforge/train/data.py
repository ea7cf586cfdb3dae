"""What the training loop trains on: a source of batches, a validation, and a tokenizer.

The loop is the same for pretraining and fine-tuning; only this differs. `TokenShards` is
pretraining's: random or sequential windows of `lmforge tokenize`'s shards, validated by bits
per byte on their `val` split. Post-training brings its own (posttrain/sft_data.py: packed
conversations whose loss covers the assistant's tokens only). A batch is `(x, y)` or
`(x, y, segments)`: targets of -100 carry no loss, and `segments` (B, T) numbers the documents
packed in a row, so that attention and positions stay inside each one (model/transformer.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.tokenizer import Tokenizer
from lmforge.tokens import load_tokens, read_meta
from lmforge.train.batches import Batches, make_batches
from lmforge.train.bpb import EvalResult, eval_batches, evaluate, token_byte_lengths
from lmforge.train.config import TrainConfig


class TrainingData(Protocol):
    tokenizer_dir: Path  # copied into every checkpoint
    vocab_size: int  # the model's embedding rows

    def batches(self, cfg: TrainConfig, rank: int, world_size: int) -> Batches:
        """This data-parallel rank's share of every global batch (train/batches.py's API)."""
        ...

    def validation_batches(self, cfg: TrainConfig) -> int:
        """How many batches `validate` runs (for its progress bar)."""
        ...

    def validate(
        self, model: Callable[..., torch.Tensor], cfg: TrainConfig, device: torch.device
    ) -> EvalResult: ...


class TokenShards:
    """Pretraining's data: a folder of token shards with its tokenizer."""

    def __init__(self, shard_dir: str | Path) -> None:
        self.shard_dir = Path(shard_dir)
        meta = read_meta(shard_dir)
        self.tokenizer_dir = self.shard_dir / "tokenizer"
        self.tokenizer = Tokenizer.load(self.tokenizer_dir)
        if meta.tokenizer_fingerprint != self.tokenizer.fingerprint():
            raise LmforgeError(
                f"token shards in {shard_dir} do not match the tokenizer in {self.tokenizer_dir}: "
                "re-tokenize with `lmforge tokenize`"
            )
        self.vocab_size = meta.vocab_size
        require_val_shard(shard_dir)
        self.val_tokens = load_tokens(shard_dir, "val")
        self.byte_lengths = token_byte_lengths(self.tokenizer)

    def batches(self, cfg: TrainConfig, rank: int, world_size: int) -> Batches:
        return make_batches(
            cfg.loader.kind,
            self.shard_dir,
            cfg.batch_size,
            cfg.seq_len,
            cfg.seed,
            rank,
            world_size,
            segments=cfg.loader.document_mask,
        )

    def validation_batches(self, cfg: TrainConfig) -> int:
        return eval_batches(len(self.val_tokens), cfg.seq_len, cfg.batch_size, cfg.eval.batches)

    def validate(self, model: nn.Module, cfg: TrainConfig, device: torch.device) -> EvalResult:
        return evaluate(
            model,
            self.val_tokens,
            self.byte_lengths,
            cfg.seq_len,
            cfg.batch_size,
            cfg.eval.batches,
            device,
        )


def require_val_shard(shard_dir: str | Path) -> None:
    """Training validates on the val shard: a folder without one (`lmforge tokenize` of one
    document, or with --val-fraction 0) is refused before any work."""
    if "val" not in read_meta(shard_dir).shards:
        raise LmforgeError(
            f"token shards in {shard_dir} have no val shard, which training validates on: "
            "re-tokenize with --val-fraction above 0 and at least two documents"
        )


def as_training_data(data: str | Path | TrainingData) -> TrainingData:
    """A shard folder's path becomes its TokenShards; anything else is used as it is."""
    return TokenShards(data) if isinstance(data, (str, Path)) else data
