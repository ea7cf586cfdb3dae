"""`lmforge eval`: a checkpoint's loss and bits per byte on held-out data.

The data is a token shard folder (its `val` shard) or documents (a path, or the built-in
corpus): then the validation split is the same stable hash split that training held out.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lmforge.data import is_validation, read_documents, stdlib_documents
from lmforge.errors import LmforgeError
from lmforge.eval.bpb import EvalResult, evaluate, token_byte_lengths
from lmforge.prepare import DataConfig
from lmforge.tokens import load_tokens, read_meta
from lmforge.tokens.encode import document_ids
from lmforge.train.checkpoint import load_checkpoint, resolve_checkpoint


def evaluate_checkpoint(
    checkpoint: str | Path,
    data: str | Path | None = None,
    val_fraction: float | None = None,
    seq_len: int | None = None,
    batch_size: int = 8,
    max_batches: int = 64,
    device: str = "cpu",
) -> EvalResult:
    model, tokenizer = load_checkpoint(checkpoint, device)
    if val_fraction is None:  # the split the checkpoint's own run held out
        run = json.loads((resolve_checkpoint(checkpoint) / "config.json").read_text())["run"]
        val_fraction = run.get("data", {}).get("val_fraction", DataConfig.val_fraction)
    seq_len = seq_len or model.config.max_seq_len
    if data is not None and (Path(data) / "meta.json").exists():
        if read_meta(data).tokenizer_fingerprint != tokenizer.fingerprint():
            raise LmforgeError(
                f"token shards in {data} use another tokenizer than the checkpoint: "
                "pass raw documents instead, or shards made with the checkpoint's tokenizer"
            )
        tokens = load_tokens(data, "val")
    else:
        docs = read_documents(data) if data is not None else stdlib_documents()
        ids: list[int] = []
        for doc in docs:
            if is_validation(doc.id, val_fraction):
                ids.extend(document_ids(tokenizer, doc.text))
        tokens = np.asarray(ids, dtype=np.int64)
    return evaluate(
        model, tokens, token_byte_lengths(tokenizer), seq_len, batch_size, max_batches, device
    )
