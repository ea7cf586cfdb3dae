"""Generation for one prompt, as a function: the engine's one decode path, run on the caller's
thread a step at a time (Engine.run_here), with no server or batch around it."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, ClassVar

import torch

from lmforge.errors import LmforgeError
from lmforge.infer.engine import BLOCK_SIZE, Engine, SamplingParams
from lmforge.infer.sampling import check_sampling_args

if TYPE_CHECKING:
    from lmforge.model.transformer import Transformer


@contextmanager
def _inference(model: torch.nn.Module) -> Iterator[None]:
    # Entered around each step rather than the whole generator, so the caller's code that runs
    # between yielded tokens never sees eval mode or inference mode.
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def stream(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_ids: Collection[int] = (),
) -> Iterator[int]:
    """Yield up to max_new_tokens new token ids, one at a time.

    A token in stop_ids is yielded and ends generation. A prompt longer than max_seq_len - 1 keeps
    its last tokens; generation also ends when the context window is full.
    """
    if len(prompt_ids) == 0:
        raise LmforgeError(
            "the prompt is empty: pass at least one token, e.g. the tokenizer's <|endoftext|> id"
        )
    if max_new_tokens < 0:
        raise LmforgeError(f"max_new_tokens={max_new_tokens} is negative: use 0 or more")
    check_sampling_args(temperature, top_k, top_p)
    # Checked above, before the first next(): the body below runs lazily.
    return _stream(model, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, stop_ids)


def _stream(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    stop_ids: Collection[int],
) -> Iterator[int]:
    max_seq_len = model.config.max_seq_len
    ids = list(prompt_ids)[-max(1, max_seq_len - 1) :]  # leave room for one new token
    n_steps = min(max_new_tokens, max_seq_len - len(ids))
    if n_steps <= 0:
        return
    params = SamplingParams(
        max_tokens=n_steps,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop_ids=tuple(stop_ids),
    )
    with _inference(model):  # the engine puts the model in eval mode; restored after
        blocks = -(-(len(ids) + n_steps) // BLOCK_SIZE)
        engine = Engine(model, _Ids(), max_batch_size=1, max_kv_tokens=blocks * BLOCK_SIZE)
    for event in engine.run_here(ids, params, lambda: _inference(model)):
        yield event.token_id


class _Ids:
    """No text and no special tokens: a stream yields ids and stops only at `stop_ids`."""

    special_tokens: ClassVar[dict[str, int]] = {}

    def token_bytes(self, token: int) -> bytes:
        return b""


def generate(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_ids: Collection[int] = (),
) -> list[int]:
    """The new token ids (not the prompt); see stream for the stopping rules."""
    return list(
        stream(
            model,
            prompt_ids,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop_ids=stop_ids,
        )
    )
