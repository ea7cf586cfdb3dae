"""Conversations as fine-tuning data: OpenAI `messages` JSONL → rendered ids and loss masks →
rows packed best-fit → the training loop's batches and validation (train/data.py's protocol).

A conversation of L tokens fills L - 1 (input, target) slots; its targets carry loss only where
the chat template's mask is 1 (the assistant's tokens), every other target is -100. Rows hold
whole conversations, placed best-fit decreasing (each into the row it fills most tightly), and
number them in `segments`, so attention and positions restart at each one: a packed row
computes exactly what its conversations would alone, and no loss crosses a boundary.
Batches are a pure function of (seed, step, micro-step): an epoch is a seeded permutation of
the rows, so a resumed run needs no loader state.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lmforge.errors import LmforgeError
from lmforge.tokenizer import Tokenizer
from lmforge.tokenizer.chat_template import ROLES, ChatTemplate, Message
from lmforge.train.bpb import EvalResult, token_byte_lengths
from lmforge.train.config import TrainConfig

IGNORE = -100  # cross_entropy's ignore_index: a target without loss


def read_conversations(path: str | Path) -> list[list[Message]]:
    """Every line's `messages` (system/user/assistant, at least one assistant message). A bad
    line is an error naming file:line."""
    path = Path(path)
    if not path.is_file():
        raise LmforgeError(f'{path} not found: pass a JSONL file of {{"messages": [...]}} lines')
    conversations = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                conversations.append(_conversation(line, f"{path}:{number}"))
    if not conversations:
        raise LmforgeError(f'{path} holds no conversations: add {{"messages": [...]}} lines')
    return conversations


def _conversation(line: str, where: str) -> list[Message]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise LmforgeError(f"{where}: not valid JSON ({e.msg}): fix the line") from None
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        raise LmforgeError(f'{where}: no "messages" list: write {{"messages": [...]}}')
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else m
            raise LmforgeError(f"{where}: a message's role is {role!r}: use {', '.join(ROLES)}")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: the text parts, joined
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise LmforgeError(f"{where}: a {m['role']} message has no text content")
        out.append(Message(m["role"], content))
    if not any(m.role == "assistant" for m in out):
        raise LmforgeError(f"{where}: no assistant message, so nothing to learn: add the reply")
    return out


@dataclass
class Example:
    ids: list[int]
    mask: list[int]  # 1 where the token is learned (the assistant's)


def render_all(template: ChatTemplate, conversations: Sequence[list[Message]]) -> list[Example]:
    return [Example(*template.render(c)) for c in conversations]


@dataclass
class Packed:
    """Rows of `seq_len` slots: inputs, targets (IGNORE without loss) and document numbers."""

    inputs: np.ndarray  # (R, T) int64
    targets: np.ndarray  # (R, T) int64
    segments: np.ndarray  # (R, T) int64; padding is a document of its own
    truncated: int  # conversations cut to fit a row
    fill: float  # the share of slots holding a conversation's tokens

    def __len__(self) -> int:
        return len(self.inputs)


def pack(examples: Sequence[Example], seq_len: int) -> Packed:
    """Best-fit decreasing packing of whole conversations into rows of `seq_len` slots; one
    longer than a row keeps its first seq_len + 1 tokens."""
    sized = []
    truncated = 0
    for example in examples:
        ids, mask = example.ids, example.mask
        if len(ids) > seq_len + 1:
            ids, mask = ids[: seq_len + 1], mask[: seq_len + 1]
            truncated += 1
        if len(ids) >= 2 and any(mask[1:]):
            sized.append((ids, mask))
    if not sized:
        raise LmforgeError(
            "no conversation has an assistant token to learn within the row length: check the "
            "data, or raise train.seq_len"
        )
    sized.sort(key=lambda e: len(e[0]), reverse=True)
    rows: list[list[tuple[list[int], list[int]]]] = []
    free: list[tuple[int, int]] = []  # (slots left, row), sorted: the tightest fit is found first
    for ids, mask in sized:
        need = len(ids) - 1
        at = bisect.bisect_left(free, (need, -1))
        if at == len(free):
            rows.append([])
            left, row = seq_len, len(rows) - 1
        else:
            left, row = free.pop(at)
        rows[row].append((ids, mask))
        if left - need > 0:
            bisect.insort(free, (left - need, row))
    inputs = np.zeros((len(rows), seq_len), dtype=np.int64)
    targets = np.full((len(rows), seq_len), IGNORE, dtype=np.int64)
    segments = np.zeros((len(rows), seq_len), dtype=np.int64)
    used = 0
    for r, row in enumerate(rows):
        at = 0
        for doc, (ids, mask) in enumerate(row):
            n = len(ids) - 1
            inputs[r, at : at + n] = ids[:-1]
            targets[r, at : at + n] = np.where(np.asarray(mask[1:]) == 1, ids[1:], IGNORE)
            segments[r, at : at + n] = doc
            at += n
        segments[r, at:] = len(row)  # padding attends only to padding, never to a document
        used += at
    return Packed(inputs, targets, segments, truncated, used / inputs.size)


class PackedBatches:
    """Global batches of packed rows, epoch after epoch in seeded orders; this rank's share
    (rows [r·b/n, (r+1)·b/n) of each, as train/batches.py splits them)."""

    def __init__(
        self,
        packed: Packed,
        batch_size: int,
        grad_accum_steps: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.packed = packed
        self.batch_size, self.accum, self.seed = batch_size, grad_accum_steps, seed
        share = batch_size // world_size
        self.rows = slice(rank * share, (rank + 1) * share)
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            rng = np.random.default_rng((self.seed, epoch))
            self._orders = {epoch: rng.permutation(len(self.packed))}
        return self._orders[epoch]

    def next(self, step: int, micro_step: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        n = len(self.packed)
        first = (step * self.accum + micro_step) * self.batch_size
        picks = [self._order(k // n)[k % n] for k in range(first, first + self.batch_size)]
        picks = np.asarray(picks)[self.rows]
        p = self.packed
        return tuple(
            torch.from_numpy(a[picks]).to(device) for a in (p.inputs, p.targets, p.segments)
        )

    def epoch(self, step: int) -> float:
        return step * self.accum * self.batch_size / len(self.packed)

    def state_dict(self) -> dict:
        return {"kind": "packed"}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != "packed":
            raise LmforgeError(
                f"the checkpoint's loader state is {state.get('kind')!r}, not a fine-tuning "
                "run's: resume it with the command that wrote it, or start over with --fresh"
            )

    def log_fields(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class Conversations:
    """Fine-tuning data for the training loop (train/data.py's TrainingData): packed training
    conversations, and a validation of the loss on the held-out ones' assistant tokens."""

    def __init__(
        self,
        train: Sequence[Example],
        val: Sequence[Example],
        tokenizer_dir: str | Path,
        vocab_size: int,
        seq_len: int,
    ) -> None:
        self.tokenizer_dir = Path(tokenizer_dir)
        self.vocab_size = vocab_size
        self.train = pack(train, seq_len)
        self.val = pack(val, seq_len)
        self.byte_lengths = token_byte_lengths(Tokenizer.load(self.tokenizer_dir))

    def batches(self, cfg: TrainConfig, rank: int, world_size: int) -> PackedBatches:
        return PackedBatches(
            self.train, cfg.batch_size, cfg.grad_accum_steps, cfg.seed, rank, world_size
        )

    def validation_batches(self, cfg: TrainConfig) -> int:
        return min(cfg.eval.batches, math.ceil(len(self.val) / cfg.batch_size))

    @torch.no_grad()
    def validate(self, model, cfg: TrainConfig, device: torch.device) -> EvalResult:
        """Mean loss per assistant token, and bits per byte of the assistant's text."""
        was_training = model.training
        model.eval()
        nats = torch.zeros((), dtype=torch.float64, device=device)
        tokens = n_bytes = 0
        lengths = torch.from_numpy(self.byte_lengths).to(device)
        for b in range(self.validation_batches(cfg)):
            rows = slice(b * cfg.batch_size, (b + 1) * cfg.batch_size)
            x, y, seg = (
                torch.from_numpy(a[rows]).to(device)
                for a in (self.val.inputs, self.val.targets, self.val.segments)
            )
            logits = model(x, segments=seg)
            loss = F.cross_entropy(
                logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum"
            )
            nats += loss.double()
            learned = y[y != IGNORE]
            tokens += learned.numel()
            n_bytes += int(lengths[learned].sum())
        model.train(was_training)
        total = float(nats)
        return EvalResult(
            loss=total / max(tokens, 1),
            bpb=total / math.log(2) / max(n_bytes, 1),
            tokens=tokens,
            bytes=n_bytes,
        )
