"""Continuation scoring with shared-context prefill equals scoring each sequence whole."""

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.infer.score import score
from lmforge.model import Transformer
from tests.infer.scoring_model import scoring_model


def whole(m: Transformer, context: list[int], continuation: list[int]) -> list[float]:
    """The reference: the full sequence in one forward pass, no cache, no padding."""
    ids = torch.tensor([context + continuation[:-1]])  # the last token is only predicted
    with torch.no_grad():
        logprobs = m(ids)[0].float().log_softmax(-1)
    positions = range(len(context) - 1, len(context) + len(continuation) - 1)
    return [logprobs[p, t].item() for p, t in zip(positions, continuation, strict=True)]


def requests(seed: int, n_questions: int, choices: int) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> list[int]:
        n = int(torch.randint(low, high, (1,), generator=g))
        return torch.randint(0, 97, (n,), generator=g).tolist()

    out = []
    for _ in range(n_questions):
        context = draw(1, 30)
        out += [(context, draw(1, 9)) for _ in range(choices)]
    return out


@pytest.mark.parametrize("batch_tokens", [1, 64, 4096])
def test_scores_equal_whole_sequence_forward(batch_tokens):
    m = scoring_model()
    reqs = requests(0, 7, 4)
    scored = score(m, reqs, top_n=3, batch_tokens=batch_tokens)
    for (context, continuation), got in zip(reqs, scored, strict=True):
        ref = whole(m, context, continuation)
        assert got.logprobs == pytest.approx(ref, abs=1e-5)
        assert len(got.greedy) == len(continuation) and len(got.top) == len(continuation)
        for (best, best_lp), lp, token, greedy in zip(
            (t[0] for t in got.top), got.logprobs, continuation, got.greedy, strict=True
        ):
            assert best_lp >= lp - 1e-6
            assert greedy == (best == token)


def test_greedy_continuation_is_greedy_and_windows_are_filled():
    m = scoring_model(max_seq_len=24, n_kv_heads=4)
    context = [5, 6, 7]
    ids = torch.tensor([context])
    with torch.no_grad():
        for _ in range(6):  # greedy decode: its own continuation is all argmax
            nxt = m(ids)[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    greedy = ids[0, 3:].tolist()
    long_context = list(range(21))  # 21 + 4 - 1 inputs fill the 24-token window exactly
    got = score(m, [(context, greedy), (long_context, [1, 2, 3, 4]), (context, [0])])
    assert got[0].is_greedy
    assert got[1].logprobs == pytest.approx(whole(m, long_context, [1, 2, 3, 4]), abs=1e-5)
    assert got[2].logprobs == pytest.approx(whole(m, context, [0]), abs=1e-5)


def test_bad_requests_are_refused():
    m = scoring_model(max_seq_len=16)
    with pytest.raises(LmforgeError, match="empty context"):
        score(m, [([], [1])])
    with pytest.raises(LmforgeError, match="left-truncate"):
        score(m, [(list(range(10)), list(range(8)))])


def test_many_continuations_of_one_context_split_into_rows_of_two_windows():
    m = scoring_model(max_seq_len=16)
    context = list(range(1, 11))
    reqs = [(context, [20 + j] * 6) for j in range(8)]  # 10 + 8 x 5 inputs: more than 2 x 16
    for (ctx, continuation), got in zip(reqs, score(m, reqs), strict=True):
        assert got.logprobs == pytest.approx(whole(m, ctx, continuation), abs=1e-5)
