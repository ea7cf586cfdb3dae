"""Text to the token requests a model scores, exactly as lm-evaluation-harness makes them.

Agreeing with lm-eval to 1e-4 means agreeing on tokens first: where the context ends and the
continuation starts (`encode_pair`), what is cut when a request is too long (`fit_window`), and
how a long document is split into scored windows (`rolling_windows`). Each follows lm-eval
0.4's `TemplateLM._encode_pair`, `HFLM._loglikelihood_tokens` and
`utils.get_rolling_token_windows` + `make_disjoint_window`.

`bos`: lm-eval's hf backend encodes with the tokenizer's own special tokens, and the tokenizer
`lmforge export` writes starts every text with `<|endoftext|>` (as every training document
started), unless the text already starts with it; an empty context's continuation is encoded
without it. lm-eval's API backends (`local-completions`) against `lmforge serve` get the same,
as the server's `/tokenize` applies the same rule (lmforge.tokens.encode.document_start).
`bos=None` leaves it out, as the hf backend's `add_bos_token=False` does.
"""

from __future__ import annotations

from lmforge.errors import LmforgeError
from lmforge.tokenizer import Tokenizer
from lmforge.tokens.encode import document_start


def encode(tokenizer: Tokenizer, text: str, bos: int | None = None) -> list[int]:
    """Text to ids, special-token text to its special id (as a Hugging Face tokenizer does),
    after `bos` (`<|endoftext|>`, lmforge's document start: tokens.encode.document_start)
    unless the text starts with it."""
    ids = tokenizer.encode(text, allowed_special="all")
    if bos is None:
        return ids
    if bos != tokenizer.eot_id:
        raise LmforgeError(f"bos={bos} is not <|endoftext|>: pass the tokenizer's eot_id or None")
    return document_start(tokenizer, ids)


def encode_pair(
    tokenizer: Tokenizer,
    context: str,
    continuation: str,
    prefix_id: int,
    bos: int | None = None,
    contexts: dict[str, list[int]] | None = None,
) -> tuple[list[int], list[int]]:
    """Context and continuation ids. Trailing spaces of the context move to the continuation;
    both are encoded together and split after the context's own encoding, so the ids at the
    seam are the ones the whole text gets. An empty context is the prefix token alone.
    `contexts` memoizes context encodings (a question's choices share one)."""
    if not context:
        ids = encode(tokenizer, continuation)
        return ([prefix_id], ids) if ids[:1] != [prefix_id] else (ids[:1], ids[1:])
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = encode(tokenizer, context + continuation, bos)
    if contexts is None:
        context_ids = encode(tokenizer, context, bos)
    else:
        if context not in contexts:
            contexts[context] = encode(tokenizer, context, bos)
        context_ids = contexts[context]
    return context_ids, whole[len(context_ids) :]


def fit_window(
    context: list[int], continuation: list[int], max_length: int
) -> tuple[list[int], list[int]]:
    """The request cut from the left to at most max_length + 1 tokens (the last token is only
    predicted), as lm-eval's hf backend cuts it; a continuation longer than the window loses
    its first tokens too, and at least one context token is kept."""
    whole = (context + continuation)[-(max_length + 1) :]
    n_context = max(1, len(whole) - len(continuation))
    return whole[:n_context], whole[n_context:]


def rolling_windows(
    ids: list[int], prefix_id: int, max_length: int
) -> list[tuple[list[int], list[int]]]:
    """Disjoint (context, continuation) windows that together predict every token of `ids`
    once: the first conditioned on the prefix token alone, each later one on as much of the
    text before it as the window holds."""
    if not ids:
        return []
    windows = [([prefix_id], ids[:max_length])]
    predicted = len(windows[0][1])
    while predicted < len(ids):
        end = min(len(ids), predicted + max_length)
        n = end - predicted
        start = max(0, end - max_length - 1)
        context = ids[start : end - 1]
        windows.append((context[: len(context) - (n - 1)], ids[predicted:end]))
        predicted = end
    return windows
