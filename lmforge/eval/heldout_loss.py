"""`lmforge eval`: a checkpoint's loss and bits per byte on held-out data, and what that data was.

Without `--data` it is the validation split of the data the checkpoint's run trained on, which
the checkpoint records (`trained_on` in its config.json): the run's token shards (their `val`
shard) while they exist, else its documents again, split by the same stable id hash. A run whose
data is gone, or an imported checkpoint that records none, needs `--data`. With `--data`: a
token shard folder (its `val` shard) or documents (their held-out split by id hash).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmforge.data import is_validation, read_documents, stdlib_documents
from lmforge.errors import LmforgeError
from lmforge.prepare import DataConfig
from lmforge.quant.checkpoint import load_any_checkpoint
from lmforge.tokenizer import Tokenizer
from lmforge.tokens import load_tokens, read_meta
from lmforge.tokens.encode import document_ids
from lmforge.train.bpb import EvalResult, evaluate, token_byte_lengths
from lmforge.train.checkpoint_dir import TRAINED_ON, read_run_config, resolve_checkpoint


@dataclass
class CheckpointEval:
    result: EvalResult
    data: str  # what was read, e.g. "token shards runs/p1/tokens"
    split: str  # which part of it, e.g. "val shard, 12,288 tokens"
    own_data: bool  # the data the checkpoint's run trained on (no --data given)

    def describe(self) -> str:
        own = " (the run's own validation data)" if self.own_data else ""
        return f"evaluated {self.data}: {self.split}{own}"


def evaluate_checkpoint(
    checkpoint: str | Path,
    data: str | Path | None = None,
    val_fraction: float | None = None,
    seq_len: int | None = None,
    batch_size: int = 8,
    max_batches: int = 64,
    device: str = "cpu",
) -> CheckpointEval:
    model, tokenizer = load_any_checkpoint(checkpoint, device)
    tokens, what, split, own_data = validation_tokens(checkpoint, tokenizer, data, val_fraction)
    result = evaluate(
        model,
        tokens,
        token_byte_lengths(tokenizer),
        seq_len or model.config.max_seq_len,
        batch_size,
        max_batches,
        device=next(model.parameters()).device,
    )
    return CheckpointEval(result, what, split, own_data)


def validation_tokens(
    checkpoint: str | Path,
    tokenizer: Tokenizer,
    data: str | Path | None = None,
    val_fraction: float | None = None,
) -> tuple[np.ndarray, str, str, bool]:
    """(tokens, what, split, own_data): the validation tokens of `data` (default: the data the
    checkpoint's run trained on, its own held-out split), with words for the report."""
    found = resolve_checkpoint(checkpoint)
    run = read_run_config(found)
    if val_fraction is None:  # the split the checkpoint's own run held out
        val_fraction = run.get("data", {}).get("val_fraction", DataConfig.val_fraction)
    own_data = data is None
    if data is None:
        data = run_data(found, run, tokenizer)
    if data != "stdlib" and (Path(data) / "meta.json").exists():
        if read_meta(data).tokenizer_fingerprint != tokenizer.fingerprint():
            raise LmforgeError(
                f"token shards in {data} use another tokenizer than the checkpoint: "
                "pass raw documents instead, or shards made with the checkpoint's tokenizer"
            )
        tokens = load_tokens(data, "val")
        what, split = f"token shards {data}", f"val shard, {len(tokens):,} tokens"
    else:
        docs = stdlib_documents() if data == "stdlib" else read_documents(data)
        ids: list[int] = []
        for doc in docs:
            if is_validation(doc.id, val_fraction):
                ids.extend(document_ids(tokenizer, doc.text))
        tokens = np.asarray(ids, dtype=np.int64)
        what = "the Python standard library" if data == "stdlib" else f"documents {data}"
        split = f"held-out {val_fraction:g} by id hash, {len(tokens):,} tokens"
    return tokens, what, split, own_data


def run_data(checkpoint: Path, run: dict, tokenizer: Tokenizer) -> str:
    """The data `checkpoint`'s run trained on: its token shard folder while it is there (and
    made with this tokenizer), else its documents ("stdlib" for the built-in corpus)."""
    trained = run.get(TRAINED_ON) or {}
    shards = [trained.get("shards")]
    if checkpoint.parent.name == "checkpoints":  # a run folder moved since: its own tokens/
        shards.append(str(checkpoint.parent.parent / "tokens"))
    for folder in filter(None, shards):
        meta = Path(folder) / "meta.json"
        if meta.is_file() and read_meta(folder).tokenizer_fingerprint == tokenizer.fingerprint():
            return folder
    if TRAINED_ON in run:
        documents = trained.get("documents")
    elif "data" in run:  # written before checkpoints recorded their data
        documents = run["data"].get("path") or "stdlib"
    else:
        documents = None
    if documents == "stdlib" or (
        documents and not documents.startswith("hf:") and Path(documents).exists()
    ):
        return documents
    if documents and documents.startswith("hf:"):
        raise LmforgeError(
            f"checkpoint {checkpoint} was trained on {documents}, whose token shards are gone: "
            "pass --data with documents or token shards to evaluate on"
        )
    if documents is None and "imported_from" in run:
        raise LmforgeError(
            f"checkpoint {checkpoint} was imported from {run['imported_from']} and records no "
            "training data: pass --data with documents or token shards to evaluate on"
        )
    gone = " and ".join(filter(None, [trained.get("shards"), documents]))
    if not gone:
        raise LmforgeError(
            f"checkpoint {checkpoint} records no training data: pass --data with documents or "
            "token shards to evaluate on"
        )
    raise LmforgeError(
        f"the data checkpoint {checkpoint} was trained on is gone ({gone}): pass --data with "
        "its documents or token shards"
    )
