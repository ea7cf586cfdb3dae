"""`lmforge chat`: a conversation with a checkpoint in the terminal, replies streamed as generated.

Every turn the whole conversation goes through the chat template
(`tokenizer/chat_template.py`); when it no longer fits the context window with room for a
reply, the oldest messages are left out (a leading system message stays). `/reset` starts a
new conversation; `/exit` or the end of input quits; Ctrl-C during a reply stops that reply.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from lmforge.errors import LmforgeError
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.weight_layouts import load_for_decode
from lmforge.tokenizer import Tokenizer
from lmforge.tokenizer.chat_template import ChatTemplate, Message

HELP = "/reset starts a new conversation, /exit quits"


def chat_session(
    engine: Engine,
    tokenizer: Tokenizer,
    lines: Iterable[str],
    out: TextIO,
    params: SamplingParams,
    system: str | None = None,
) -> list[Message]:
    """Answer each line of `lines` in turn, writing the replies to `out`; the conversation."""
    template = ChatTemplate(tokenizer)
    if params.max_tokens >= engine.max_context:
        raise LmforgeError(
            f"max_tokens={params.max_tokens} leaves no room for the conversation in the "
            f"{engine.max_context}-token context window: use fewer"
        )
    params.validate(engine.max_context)
    start = [Message("system", system)] if system else []
    messages = list(start)
    left_out = 0
    for line in lines:
        text = line.strip()
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            messages, left_out = list(start), 0
            out.write("(new conversation)\n")
            continue
        if not text:
            continue
        messages.append(Message("user", text))
        try:
            ids, dropped = template.fit(messages, engine.max_context - params.max_tokens)
        except LmforgeError as e:
            messages.pop()
            out.write(f"error: {e}\n")
            continue
        if dropped > left_out:
            out.write(f"({dropped} earliest messages no longer fit the context and are left out)\n")
            left_out = dropped
        reply = _stream_reply(engine, ids, params, template, out)
        messages.append(Message("assistant", reply))
    return messages


def _stream_reply(
    engine: Engine, ids: list[int], params: SamplingParams, template: ChatTemplate, out: TextIO
) -> str:
    params = replace(
        params, stop=params.stop + template.stop, stop_ids=params.stop_ids + template.stop_ids
    )
    handle = engine.submit(ids, params)
    stripper = template.reply_stripper()
    reply = []
    try:
        for event in handle:
            piece = stripper.feed(event.text)
            reply.append(piece)
            out.write(piece)
            out.flush()
    except KeyboardInterrupt:
        handle.cancel()
        out.write(" [stopped]")
    out.write("\n")
    return "".join(reply)


def _input_lines(prompt: str) -> Iterator[str]:
    if sys.stdin.isatty():
        import readline  # noqa: F401  (line editing and ↑ history for input())
    while True:
        try:
            yield input(prompt)
        except EOFError:
            return


def run_chat(
    checkpoint: str | Path,
    params: SamplingParams,
    system: str | None = None,
    device: str = "cpu",
    *,
    compile: bool = False,
    adapter: str | Path | None = None,
) -> None:
    """`lmforge chat`: load a checkpoint (and a LoRA adapter) and talk to it on stdin/stdout."""
    model, tokenizer = load_for_decode(checkpoint, device, adapter)
    engine = Engine(model, tokenizer, max_batch_size=1, compile=compile, relayout_weights=True)
    with engine:
        template = ChatTemplate(tokenizer)
        print(
            f"chatting with {checkpoint} ({template.name} template, "
            f"{engine.max_context}-token context); {HELP}"
        )
        chat_session(engine, tokenizer, _input_lines("> "), sys.stdout, params, system)
