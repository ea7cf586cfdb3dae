"""`lmforge generate`: one prompt streamed as text, or many prompts batched into JSON lines.

A single --prompt streams its completion to stdout as it is generated. A --prompts-file (one
prompt per line, or JSON lines with a "prompt" field), --logprobs or --beams print one JSON
object per prompt instead, in input order.

The flags become sampling parameters here (`generate_options`): --stop strings take backslash
escapes, and beam search, which is deterministic and has no stop strings, refuses the sampling
flags rather than ignoring them. What does not fit the context window is cut with a note on
stderr (`fit_context`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from lmforge.errors import LmforgeError
from lmforge.infer.beam import beam_search
from lmforge.infer.engine import SamplingParams, serving_engine
from lmforge.infer.text import prompt_ids
from lmforge.infer.weight_layouts import load_for_decode

# The sampling flags' defaults. The parser leaves them None, so a flag the user passed can be
# told from one left alone, even when passed with its default value.
SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 0.8,
    "top_k": None,
    "top_p": 0.95,
    "min_p": None,
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "seed": None,
}
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\"}
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.?)", re.DOTALL)


def unescape(text: str) -> str:
    """`text` with the backslash escapes \\n, \\t, \\r, \\0, \\\\ and \\uXXXX decoded."""

    def decode(match: re.Match[str]) -> str:
        code = match.group(1)
        if code in ESCAPES:
            return ESCAPES[code]
        if len(code) == 5:
            return chr(int(code[1:], 16))
        raise LmforgeError(
            f"--stop {text!r} has an unknown escape \\{code}: use \\n, \\t, \\r, \\0, "
            "\\uXXXX, or \\\\ for a backslash"
        )

    return _ESCAPE.sub(decode, text)


def generate_options(flags: Mapping[str, Any]) -> tuple[SamplingParams, int, float]:
    """`lmforge generate`'s parsed flags (None where not given) as sampling parameters, the
    number of beams (0: sample) and the length penalty; contradictory flags are refused."""
    beams, length_penalty = flags["beams"], flags["length_penalty"]
    if beams is not None:
        if beams < 2:
            raise LmforgeError(
                f"--beams {beams} is not a beam search: pass 2 or more, or leave --beams out "
                "to sample"
            )
        given = [k for k in (*SAMPLING_DEFAULTS, "logprobs", "stop") if _given(flags[k])]
        if given:
            names = ", ".join("--" + k.replace("_", "-") for k in given)
            raise LmforgeError(
                f"--beams searches deterministically: {names} would be ignored; leave "
                f"{'it' if len(given) == 1 else 'them'} out, or leave --beams out to sample"
            )
    elif length_penalty is not None:
        raise LmforgeError("--length-penalty scores beams: pass it with --beams K, or leave it out")
    values = {k: d if flags[k] is None else flags[k] for k, d in SAMPLING_DEFAULTS.items()}
    params = SamplingParams(
        max_tokens=flags["max_new_tokens"],
        stop=tuple(unescape(s) for s in flags["stop"]),
        logprobs=flags["logprobs"],
        **values,
    )
    params.validate()
    return params, beams or 0, 1.0 if length_penalty is None else length_penalty


def _given(value: Any) -> bool:
    return value is not None and value is not False and value != []  # 0 and 0.0 are given


def fit_context(
    prompts: list[list[int]], max_tokens: int, context: int, err: TextIO
) -> list[tuple[list[int], int]]:
    """Each prompt's tokens and new-token budget in a `context`-token window, with a note on
    `err` for what was cut: a `max_tokens` the context cannot hold means the rest of the context
    after each prompt, and a prompt that leaves no room for its budget keeps its last tokens."""
    if max_tokens >= context:
        print(
            f"note: --max-new-tokens {max_tokens} does not fit the model's {context}-token "
            "context: each prompt gets the rest of the context after it",
            file=err,
        )
    fitted = []
    for ids in prompts:
        budget = max_tokens if max_tokens < context else max(1, context - len(ids))
        fitted.append((ids[-(context - budget) :], budget))
    cut = sum(len(ids) > len(kept) for ids, (kept, _) in zip(prompts, fitted, strict=True))
    if cut:
        print(
            f"note: {cut} of {len(prompts)} prompts do not fit the {context}-token context with "
            "room for the new tokens and keep only their last tokens",
            file=err,
        )
    return fitted


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
    adapter: str | None = None,
    speculative: str | None = None,
) -> None:
    """Complete each prompt: streamed text when `stream` (one prompt), else JSON lines."""
    out = sys.stdout if out is None else out
    model, tokenizer = load_for_decode(checkpoint, device, adapter)
    encoded = [prompt_ids(tokenizer, p) for p in prompts]
    fitted = fit_context(encoded, params.max_tokens, model.config.max_seq_len, sys.stderr)
    ids = [prompt_tokens for prompt_tokens, _ in fitted]
    requests = [dataclasses.replace(params, max_tokens=n) for _, n in fitted]
    if beams:
        stops = set(tokenizer.special_tokens.values()) | set(params.stop_ids)
        for prompt, prompt_tokens, request in zip(prompts, ids, requests, strict=True):
            found = beam_search(
                model,
                prompt_tokens,
                num_beams=beams,
                max_tokens=request.max_tokens,
                length_penalty=length_penalty,
                stop_ids=stops,
            )
            texts = [tokenizer.decode([t for t in b.token_ids if t not in stops]) for b in found]
            beams_out = [{"text": t, "score": b.score} for t, b in zip(texts, found, strict=True)]
            print(json.dumps({"prompt": prompt, "beams": beams_out}), file=out)
        return
    slots = min(batch_size, len(ids))  # one prompt: a batch-1 engine, laid out for that
    with serving_engine(model, tokenizer, slots, compile, speculative, device) as engine:
        if stream:
            out.write(prompts[0])
            for event in engine.submit(ids[0], requests[0]):
                out.write(event.text)
                out.flush()
            out.write("\n")
            return
        seeds = [None if params.seed is None else params.seed + i for i in range(len(ids))]
        handles = [
            engine.submit(p, dataclasses.replace(r, seed=s))
            for p, r, s in zip(ids, requests, seeds, strict=True)
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
