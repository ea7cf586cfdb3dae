"""Chat messages to prompt token ids, and where the assistant's reply ends.

One module owns the format, so the server's /v1/chat/completions and `lmforge chat` build the
same prompt for the same conversation. Two formats:

- ChatML, when the tokenizer has `<|im_start|>` and `<|im_end|>` as special tokens (new
  tokenizers do): `<|im_start|>user\\nHi<|im_end|>\\n` per message, then
  `<|im_start|>assistant\\n`; the reply ends at `<|im_end|>`.
- Plain text otherwise: one `Role: content` line per message (`System:`, `User:`,
  `Assistant:`), then `Assistant:`; the reply ends where the model starts a new `\\nUser:`,
  `\\nSystem:` or `\\nAssistant:` line, and its leading space belongs to the format.

Either way the prompt starts a document (`<|endoftext|>` first, as in training), and message
text is encoded as ordinary text: a message that contains `<|im_end|>` cannot end its turn.
`ChatTemplate.jinja()` writes the same format as a Hugging Face `chat_template` for exports
(there, as in every Jinja template, the rendered text is tokenized whole, so that one guarantee
does not carry over).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from lmforge.errors import LmforgeError
from lmforge.tokenizer.tokenizer import EOT, Tokenizer

ROLES = ("system", "user", "assistant")
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
PLAIN_STOPS = ("\nUser:", "\nSystem:", "\nAssistant:")


@dataclass(frozen=True)
class Message:
    role: str  # one of ROLES
    content: str


@dataclass(frozen=True)
class ChatTemplate:
    """A tokenizer's chat format: `prompt_ids(messages)` plus the stops that end a reply."""

    tokenizer: Tokenizer

    @property
    def chatml(self) -> bool:
        specials = self.tokenizer.special_tokens
        return IM_START in specials and IM_END in specials

    @property
    def name(self) -> str:
        return "chatml" if self.chatml else "plain"

    @property
    def stop(self) -> tuple[str, ...]:
        """Stop strings: the reply ends before any of them."""
        return () if self.chatml else PLAIN_STOPS

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return (self.tokenizer.special_tokens[IM_END],) if self.chatml else ()

    @property
    def reply_prefix(self) -> str:
        """Text the format puts at the start of every reply; not part of the reply itself."""
        return "" if self.chatml else " "

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The conversation, then the start of the assistant's turn."""
        check_messages(messages)
        ids = self._start()
        for message in messages:
            ids += self._turn(message)
        return ids + self._reply_start()

    def fit(self, messages: Sequence[Message], budget: int) -> tuple[list[int], int]:
        """The prompt of the latest turns that fits in `budget` tokens, and how many messages
        were dropped. The oldest messages after a leading system message go first; the last
        message is always kept, so a last message that alone exceeds the budget raises."""
        check_messages(messages)
        head = list(messages[:1]) if messages[0].role == "system" else []
        turns = [self._turn(m) for m in messages[len(head) :]]
        fixed = self._start() + [t for m in head for t in self._turn(m)]
        kept: list[list[int]] = []
        size = len(fixed) + len(self._reply_start())
        for turn in reversed(turns):
            if size + len(turn) > budget:
                break
            kept.insert(0, turn)
            size += len(turn)
        if not kept:
            need = size + len(turns[-1])
            raise LmforgeError(
                f"the last message makes a {need}-token prompt but {budget} tokens are free in "
                "the context window: send a shorter message"
            )
        ids = fixed + [t for turn in kept for t in turn] + self._reply_start()
        return ids, len(turns) - len(kept)

    def render(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """A whole conversation for fine-tuning: its ids, and a loss mask of 1 on exactly the
        tokens the model must generate: each assistant message's text and the token that
        ends it (`<|im_end|>`; in the plain format, which has no end token, the text with its
        newline, and `<|endoftext|>` after a final assistant message). The same turns as
        `prompt_ids`, so a model fine-tuned on them answers the prompts it builds."""
        check_messages(messages)
        ids = self._start()
        mask = [0] * len(ids)
        eot = self.tokenizer.eot_id
        for i, message in enumerate(messages):
            header, body, end = self._parts(message)
            learn = int(message.role == "assistant")
            if learn and not self.chatml and i == len(messages) - 1 and eot is not None:
                end = [eot]  # the plain format's final reply ends the document
            stop = min(1, len(end))  # the end token, if the format has one
            ids += header + body + end
            mask += [0] * len(header) + [learn] * (len(body) + stop) + [0] * (len(end) - stop)
        return ids, mask

    def jinja(self) -> str:
        """This format as a Jinja chat template (Hugging Face's `chat_template`, for exports):
        with `add_generation_prompt` it renders the text whose tokens `prompt_ids` gives.
        `developer` messages count as `system`, as the server takes them; text content parts
        are joined."""
        start = EOT if self.tokenizer.eot_id is not None else ""
        if self.chatml:
            turn = f"{_lit(IM_START)} + role + {_lit(chr(10))} + content + {_lit(IM_END + chr(10))}"
            reply = _lit(IM_START + "assistant\n")
        else:
            turn = f"role | capitalize + {_lit(': ')} + content + {_lit(chr(10))}"
            reply = _lit("Assistant:")
        return (
            f"{{{{ {_lit(start)} }}}}"
            "{% for message in messages %}"
            "{% set role = 'system' if message['role'] == 'developer' else message['role'] %}"
            f"{{% if role not in {list(ROLES)!r} %}}"
            "{{ raise_exception('unknown message role ' + role + ': use one of "
            f"{', '.join(ROLES)}') }}}}"
            "{% endif %}"
            "{% if message['content'] is string %}{% set content = message['content'] %}"
            "{% elif message['content'] is none %}{% set content = '' %}"
            "{% else %}{% set content = message['content'] | map(attribute='text') | join %}"
            "{% endif %}"
            f"{{{{ {turn} }}}}"
            "{% endfor %}"
            f"{{% if add_generation_prompt %}}{{{{ {reply} }}}}{{% endif %}}"
        )

    def reply_stripper(self) -> ReplyStripper:
        """Removes `reply_prefix` from a reply streamed in pieces."""
        return ReplyStripper(self.reply_prefix)

    def _start(self) -> list[int]:
        eot = self.tokenizer.eot_id
        return [] if eot is None else [eot]

    def _turn(self, message: Message) -> list[int]:
        header, body, end = self._parts(message)
        return header + body + end

    def _parts(self, message: Message) -> tuple[list[int], list[int], list[int]]:
        """A message's turn as (header, body, end): the role's header is encoded apart from
        the text, as a reply is generated after `_reply_start`."""
        encode = self.tokenizer.encode_ordinary
        if self.chatml:
            specials = self.tokenizer.special_tokens
            header = [specials[IM_START], *encode(f"{message.role}\n")]
            return header, encode(message.content), [specials[IM_END], *encode("\n")]
        return encode(f"{message.role.capitalize()}:"), encode(f" {message.content}\n"), []

    def _reply_start(self) -> list[int]:
        return self._parts(Message("assistant", ""))[0]


class ReplyStripper:
    """Feed a reply's pieces in order; get them back without the leading `prefix`."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._seen = ""  # the reply so far, while it could still be (part of) the prefix
        self._done = not prefix

    def feed(self, piece: str) -> str:
        if self._done:
            return piece
        self._seen += piece
        if self._prefix.startswith(self._seen):
            return ""
        self._done = True
        return self._seen.removeprefix(self._prefix)


def _lit(text: str) -> str:
    """`text` as a Jinja string literal (Jinja decodes Python's backslash escapes in them)."""
    return json.dumps(text)


def check_messages(messages: Sequence[Message]) -> None:
    if not messages:
        raise LmforgeError("the conversation is empty: send at least one message")
    for message in messages:
        if message.role not in ROLES:
            raise LmforgeError(
                f"unknown message role {message.role!r}: use one of {', '.join(ROLES)}"
            )
