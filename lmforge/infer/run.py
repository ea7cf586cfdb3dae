"""`lmforge generate`: one prompt streamed as text, or many prompts batched into JSON lines.

A single --prompt streams its completion to stdout as it is generated. A --prompts-file (one
prompt per line, or JSON lines with a "prompt" field), --logprobs or --beams print one JSON
object per prompt instead, in input order.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TextIO

from lmforge.errors import LmforgeError
from lmforge.infer.beam import beam_search
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.text import prompt_ids
from lmforge.infer.weights import load_for_decode


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a text file (one per line) or JSON lines ({"prompt": ...} per line)."""
    try:
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line]
    except OSError as e:
        raise LmforgeError(f"cannot read prompts file {path} ({e.strerror}): check the path") from e
    if not lines:
        raise LmforgeError(f"prompts file {path} is empty: write one prompt per line")
    if not lines[0].lstrip().startswith("{"):
        return lines
    prompts = []
    for n, line in enumerate(lines, 1):
        try:
            prompts.append(str(json.loads(line)["prompt"]))
        except (ValueError, KeyError, TypeError) as e:
            raise LmforgeError(
                f"{path} line {n} is not a JSON object with a 'prompt' field ({e}): fix that line"
            ) from e
    return prompts


def run_generate(
    checkpoint: str,
    prompts: list[str],
    params: SamplingParams,
    *,
    stream: bool,
    beams: int = 0,
    length_penalty: float = 1.0,
    batch_size: int = 8,
    compile: bool = False,
    device: str = "cpu",
    out: TextIO | None = None,
) -> None:
    """Complete each prompt: streamed text when `stream` (one prompt), else JSON lines."""
    out = sys.stdout if out is None else out
    model, tokenizer = load_for_decode(checkpoint, device)
    context = model.config.max_seq_len
    params = dataclasses.replace(params, max_tokens=min(params.max_tokens, context - 1))
    room = context - params.max_tokens  # a longer prompt keeps its last tokens
    ids = [prompt_ids(tokenizer, p)[-room:] for p in prompts]
    if beams:
        stops = set(tokenizer.special_tokens.values()) | set(params.stop_ids)
        for prompt, prompt_tokens in zip(prompts, ids, strict=True):
            found = beam_search(
                model,
                prompt_tokens,
                num_beams=beams,
                max_tokens=params.max_tokens,
                length_penalty=length_penalty,
                stop_ids=stops,
            )
            texts = [tokenizer.decode([t for t in b.token_ids if t not in stops]) for b in found]
            beams_out = [{"text": t, "score": b.score} for t, b in zip(texts, found, strict=True)]
            print(json.dumps({"prompt": prompt, "beams": beams_out}), file=out)
        return
    slots = min(batch_size, len(ids))  # one prompt: a batch-1 engine, laid out for that
    with Engine(
        model, tokenizer, max_batch_size=slots, compile=compile, relayout_weights=True
    ) as engine:
        if stream:
            out.write(prompts[0])
            for event in engine.submit(ids[0], params):
                out.write(event.text)
                out.flush()
            out.write("\n")
            return
        seeds = [None if params.seed is None else params.seed + i for i in range(len(ids))]
        handles = [
            engine.submit(p, dataclasses.replace(params, seed=s))
            for p, s in zip(ids, seeds, strict=True)
        ]
        for prompt, handle in zip(prompts, handles, strict=True):
            result = handle.result()
            record = {
                "prompt": prompt,
                "completion": result.text,
                "finish_reason": result.finish_reason,
                "tokens": len(result.token_ids),
            }
            if result.logprobs is not None:
                record["logprobs"] = result.logprobs
            print(json.dumps(record), file=out, flush=True)
