"""Validation loss and bits per byte (what training validates with and eval reports), and the
unigram baseline they are judged against.

Bits per byte divides the summed cross-entropy (in bits) by the UTF-8 bytes of the predicted
tokens, so models with different tokenizers can be compared. Special tokens stand for no text:
predictions of them count in neither sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.tokenizer import Tokenizer


@dataclass
class EvalResult:
    loss: float  # mean nats per text token
    bpb: float
    tokens: int
    bytes: int


def token_byte_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """UTF-8 length of each id; 0 for special tokens and unused ids."""
    lengths = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    specials = set(tokenizer.special_tokens.values())
    for i in range(tokenizer.vocab_size):
        if i not in specials:
            try:
                lengths[i] = len(tokenizer.token_bytes(i))
            except KeyError:
                lengths[i] = 0
    return lengths


def eval_windows(data: np.ndarray, context_length: int, max_windows: int) -> np.ndarray:
    """Start offsets of consecutive, non-overlapping windows: the same ones every time."""
    if len(data) < context_length + 1:
        raise LmforgeError(
            f"validation split has {len(data)} tokens, fewer than one window of "
            f"{context_length + 1}: add data, raise data.val_fraction or lower train.seq_len"
        )
    return np.arange(0, len(data) - context_length, context_length)[:max_windows]


def eval_batches(tokens: int, seq_len: int, batch_size: int, max_batches: int) -> int:
    """How many batches `evaluate` runs on `tokens` validation tokens (for its progress bar)."""
    windows = max(0, math.ceil((tokens - seq_len) / seq_len))
    return math.ceil(min(windows, batch_size * max_batches) / batch_size)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: np.ndarray,
    byte_lengths: np.ndarray,
    context_length: int,
    batch_size: int,
    max_batches: int,
    device: torch.device | str = "cpu",
) -> EvalResult:
    was_training = model.training
    model.eval()
    starts = eval_windows(data, context_length, batch_size * max_batches)
    lengths = torch.from_numpy(byte_lengths).to(device)
    total_nats = torch.zeros((), dtype=torch.float64, device=device)
    total_bytes = torch.zeros((), dtype=torch.int64, device=device)
    total_tokens = torch.zeros((), dtype=torch.int64, device=device)
    for i in range(0, len(starts), batch_size):
        window = np.stack(
            [np.asarray(data[s : s + context_length + 1]) for s in starts[i : i + batch_size]]
        )
        window = torch.from_numpy(window.astype(np.int64)).to(device)
        x, y = window[:, :-1], window[:, 1:]
        logits = model(x)
        nats = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
        counted = lengths[y.flatten()] > 0
        total_nats += nats[counted].sum().double()
        total_bytes += lengths[y.flatten()].sum()
        total_tokens += counted.sum()
    model.train(was_training)
    tokens, n_bytes = int(total_tokens), int(total_bytes)
    if tokens == 0:
        raise LmforgeError(
            "validation windows hold only special tokens: add text to the validation data"
        )
    nats = float(total_nats)
    return EvalResult(
        loss=nats / tokens, bpb=nats / math.log(2) / n_bytes, tokens=tokens, bytes=n_bytes
    )


def unigram_bpb(train: np.ndarray, val: np.ndarray, byte_lengths: np.ndarray) -> float:
    """Bits per byte on `val` of a unigram model fit on `train`, add-one smoothed over text ids."""
    vocab = len(byte_lengths)
    is_text = byte_lengths > 0
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=vocab)[:vocab].astype(
        np.float64
    )
    counts = np.where(is_text, counts + 1.0, 0.0)
    log2_probs = np.log2(np.where(is_text, counts, 1.0) / counts.sum())
    val_counts = np.bincount(np.asarray(val, dtype=np.int64), minlength=vocab)[:vocab]
    val_counts = np.where(is_text, val_counts, 0)
    bits = -(val_counts * log2_probs).sum()
    return float(bits / (val_counts * byte_lengths).sum())
