"""Supervised fine-tuning: a base checkpoint, conversations, and the pretraining loop.

The loop is train/loop.py's, unchanged: precision, parallel layouts, checkpoints that resume
exactly, metrics. What differs is the data (posttrain/sft_data.py: packed conversations, loss on
the assistant's tokens only), the model's start (the base checkpoint's weights, with LoRA
adapters when asked: model/lora.py) and the defaults (posttrain/sft_config.py). A LoRA run also
writes its adapters in PEFT's format to `RUN/adapter/`; its checkpoints load merged.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.model import Transformer
from lmforge.model.lora import LoraSpec, apply_lora, count_trainable
from lmforge.posttrain.sft_data import Conversations, read_conversations, render_all
from lmforge.tokenizer import Tokenizer
from lmforge.tokenizer.chat_template import ChatTemplate
from lmforge.train.checkpoint import load_checkpoint, load_model_weights, read_lora
from lmforge.train.checkpoint_dir import read_model_config, resolve_checkpoint
from lmforge.train.config import TrainConfig
from lmforge.train.loop import TrainResult, train

ADAPTER_DIR = "adapter"


@dataclass
class SftData:
    data: Conversations
    conversations: int
    val_conversations: int


def prepare_conversations(
    base: Path,
    data: str | Path,
    seq_len: int,
    val_data: str | Path | None = None,
    val_fraction: float = 0.05,
    seed: int = 0,
) -> SftData:
    """Render and pack `data` (and `val_data`, else a seeded `val_fraction` of `data`) with
    the base checkpoint's tokenizer and chat template."""
    model_config = read_model_config(base)
    tokenizer_dir = base / "tokenizer"
    template = ChatTemplate(Tokenizer.load(tokenizer_dir))
    train_convs = read_conversations(data)
    if val_data is not None:
        val_convs = read_conversations(val_data)
    else:
        if not 0 < val_fraction < 1:
            raise LmforgeError(f"--val-fraction must be in (0, 1), got {val_fraction}")
        order = list(range(len(train_convs)))
        random.Random(seed).shuffle(order)
        held = set(order[: max(1, round(val_fraction * len(order)))])
        if len(held) == len(train_convs):
            raise LmforgeError(
                f"{data} has {len(train_convs)} conversation(s), too few to hold some out: "
                "add data or pass --val-data"
            )
        val_convs = [c for i, c in enumerate(train_convs) if i in held]
        train_convs = [c for i, c in enumerate(train_convs) if i not in held]
    packed = Conversations(
        render_all(template, train_convs),
        render_all(template, val_convs),
        tokenizer_dir,
        model_config.vocab_size,
        seq_len,
    )
    return SftData(packed, len(train_convs), len(val_convs))


def sft(
    base: str | Path,
    data: str | Path,
    out_dir: str | Path,
    cfg: TrainConfig,
    lora: LoraSpec | None = None,
    epochs: float = 2.0,
    val_data: str | Path | None = None,
    val_fraction: float = 0.05,
    resume: bool = True,
    threads: int | None = None,
    run_config: dict | None = None,
) -> TrainResult:
    """Fine-tune the checkpoint `base` on the conversations in `data` into `out_dir`."""
    base = resolve_checkpoint(base)
    model_config = read_model_config(base)
    if cfg.seq_len > model_config.max_seq_len:
        raise LmforgeError(
            f"train.seq_len {cfg.seq_len} exceeds the base model's max_seq_len "
            f"{model_config.max_seq_len}: lower train.seq_len"
        )
    prepared = prepare_conversations(base, data, cfg.seq_len, val_data, val_fraction, cfg.seed)
    rows = len(prepared.data.train)
    if not cfg.max_steps and not cfg.minutes:
        if epochs <= 0:
            raise LmforgeError(f"--epochs must be above 0, got {epochs}")
        steps = max(1, math.ceil(epochs * rows / (cfg.batch_size * cfg.grad_accum_steps)))
        cfg = dataclasses.replace(cfg, max_steps=steps)
    print(
        f"sft: {prepared.conversations} conversations in {rows} rows of {cfg.seq_len} "
        f"({prepared.data.train.fill:.0%} filled, {prepared.data.train.truncated} cut to fit), "
        f"{prepared.val_conversations} held out; base {base}"
    )

    def init_model(model: Transformer) -> None:
        base_model, _ = load_checkpoint(base)  # a LoRA base comes merged
        model.load_state_dict(base_model.state_dict())
        if lora is not None:
            apply_lora(model, lora)
            trainable, total = count_trainable(model)
            print(f"lora: {trainable:,} of {total:,} parameters train ({trainable / total:.2%})")

    record = {
        **(run_config or {}),
        "sft": {
            "base": str(base),
            "data": str(Path(data).resolve()),
            "val_data": str(Path(val_data).resolve()) if val_data else None,
            "val_fraction": val_fraction,
            "epochs": epochs,
            "lora": lora.to_dict() if lora else None,
        },
    }
    result = train(
        model_config,
        cfg,
        prepared.data,
        out_dir,
        record,
        resume=resume,
        threads=threads,
        init_model=init_model,
    )
    if lora is not None and not result.interrupted:
        save_run_adapter(result.checkpoint, Path(out_dir) / ADAPTER_DIR, base)
    return result


def save_run_adapter(checkpoint: Path, folder: Path, base: Path | None = None) -> Path:
    """The adapters of a LoRA run's checkpoint, as a PEFT folder."""
    from lmforge.model.peft import save_adapter

    spec = read_lora(checkpoint)
    if spec is None:
        raise LmforgeError(f"{checkpoint} was not trained with LoRA: it has no adapters")
    model = apply_lora(Transformer(read_model_config(checkpoint)), spec)
    load_model_weights(model, checkpoint)
    return save_adapter(model, folder, base_model=str(base) if base else None)
