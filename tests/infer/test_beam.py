import itertools

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.infer import generate
from lmforge.infer.beam import beam_search, score
from lmforge.model import ModelConfig, Transformer

STOP = 4
PROMPT, HORIZON = [1, 2], 4  # 4**3 * 5 + 21 = 341 continuations


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(1)
    config = ModelConfig(vocab_size=5, d_model=16, n_layers=1, n_heads=2, max_seq_len=16)
    return Transformer(config).eval()


@pytest.fixture(scope="module")
@torch.no_grad()
def every_continuation(model):
    """(log-probability, ids) of every continuation of PROMPT that ends at the stop id or at
    HORIZON tokens, from one batched full forward."""
    found = []
    for n in range(1, HORIZON + 1):
        for body in itertools.product(range(STOP), repeat=n - 1):
            found += [[*body, last] for last in (range(5) if n == HORIZON else [STOP])]
    padded = torch.tensor([PROMPT + ids + [0] * (HORIZON - len(ids)) for ids in found])
    logp = model(padded)[:, len(PROMPT) - 1 : -1].log_softmax(-1)
    picked = logp.gather(-1, padded[:, len(PROMPT) :, None])[..., 0]
    return [(float(picked[i, : len(ids)].sum()), ids) for i, ids in enumerate(found)]


def ranked(continuations, length_penalty):
    scored = [(score(lp, len(ids), length_penalty), ids) for lp, ids in continuations]
    return sorted(scored, reverse=True)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_wide_enough_beams_find_the_exhaustive_best(model, every_continuation, length_penalty):
    truth = ranked(every_continuation, length_penalty)
    beams = beam_search(
        model,
        PROMPT,
        num_beams=400,
        max_tokens=HORIZON,
        length_penalty=length_penalty,
        stop_ids={STOP},
    )
    assert len(beams) == len(truth)  # every hypothesis, in order
    assert [b.token_ids for b in beams[:10]] == [ids for _, ids in truth[:10]]
    torch.testing.assert_close(
        torch.tensor([b.score for b in beams]),
        torch.tensor([s for s, _ in truth]),
        atol=1e-5,
        rtol=0,
    )


def test_narrow_beams_return_true_scores_no_better_than_the_optimum(model, every_continuation):
    truth = {tuple(ids): s for s, ids in ranked(every_continuation, 1.0)}
    beams = beam_search(model, PROMPT, num_beams=3, max_tokens=HORIZON, stop_ids={STOP})
    assert len(beams) == 3
    assert [b.score for b in beams] == sorted((b.score for b in beams), reverse=True)
    for beam in beams:
        assert beam.score == pytest.approx(truth[tuple(beam.token_ids)], abs=1e-5)
    assert beams[0].score <= max(truth.values()) + 1e-6


def test_one_beam_is_greedy(model):
    (beam,) = beam_search(model, [1, 2, 3], num_beams=1, max_tokens=8)
    assert beam.token_ids == generate(model, [1, 2, 3], 8, temperature=0)


def test_bad_arguments_are_errors(model):
    with pytest.raises(LmforgeError, match="num_beams"):
        beam_search(model, [1], num_beams=0, max_tokens=3)
    with pytest.raises(LmforgeError, match="context"):
        beam_search(model, [1] * 10, num_beams=2, max_tokens=10)
