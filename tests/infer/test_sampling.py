import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.infer import sample_next_token
from lmforge.infer.sampling import (
    apply_penalties,
    filter_logits,
    inverse_cdf,
    mask_min_p,
    mask_top_k,
    mask_top_p,
)


def draws(logits: torch.Tensor, n: int = 2000, **kwargs) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return sample_next_token(logits.expand(n, -1), generator=g, **kwargs)


def test_temperature_zero_is_argmax():
    logits = torch.randn(5, 50)
    assert torch.equal(sample_next_token(logits, temperature=0), logits.argmax(-1))


def test_top_k_samples_only_among_the_k_largest():
    logits = torch.randn(1, 30)
    top = set(logits[0].topk(4).indices.tolist())
    seen = set(draws(logits, temperature=2.0, top_k=4).tolist())
    assert seen == top  # each of the 4 is drawn at some point, nothing else ever is


def test_top_p_samples_only_from_the_nucleus():
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.06, 0.04]])
    logits = probs.log()
    # 0.5 + 0.25 = 0.75 < 0.8, so the nucleus needs the third token too
    assert set(draws(logits, top_p=0.8).tolist()) == {0, 1, 2}
    assert set(draws(logits, top_p=0.7).tolist()) == {0, 1}
    assert set(draws(logits, top_p=0.01).tolist()) == {0}  # always at least one token


def test_top_p_frequencies_follow_renormalised_probabilities():
    logits = torch.tensor([[0.5, 0.25, 0.15, 0.1]]).log()
    counts = torch.bincount(draws(logits, n=20000, top_p=0.7), minlength=4).float()
    torch.testing.assert_close(
        counts / 20000, torch.tensor([2 / 3, 1 / 3, 0, 0]), atol=0.02, rtol=0
    )


def test_same_seed_same_tokens_different_seed_different_tokens():
    logits = torch.zeros(64, 1000)

    def sample(seed: int) -> torch.Tensor:
        return sample_next_token(logits, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1), sample(2))


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_invalid_arguments_are_errors(kwargs, word):
    with pytest.raises(LmforgeError, match=word):
        sample_next_token(torch.zeros(1, 5), **kwargs)


def test_min_p_keeps_tokens_above_a_fraction_of_the_top_probability():
    logits = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]]).log()
    assert set(draws(logits, min_p=0.15).tolist()) == {0, 1, 2}  # p >= 0.075
    assert set(draws(logits, min_p=0.7).tolist()) == {0}
    masked = mask_min_p(logits, torch.tensor([[0.15]]))
    assert torch.isinf(masked[0, 3:]).all() and torch.isfinite(masked[0, :3]).all()


def test_row_settings_apply_to_their_own_rows():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]] * 3)
    top_k = mask_top_k(logits, torch.tensor([[1], [2], [4]]))
    assert torch.isfinite(top_k).sum(-1).tolist() == [1, 2, 4]
    p = torch.tensor([[0.5], [0.85], [1.0]])
    assert torch.isfinite(mask_top_p(logits, p)).sum(-1).tolist() == [1, 2, 4]
    mixed = filter_logits(logits, top_k=torch.tensor([[3], [3], [3]]), top_p=p)
    assert torch.isfinite(mixed).sum(-1).tolist() == [1, 2, 3]


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0]])
    seen = torch.tensor([[True, True, False, False]])
    zero = torch.zeros(1, 1)
    out = apply_penalties(logits, seen, torch.zeros(1, 4), torch.tensor([[2.0]]), zero, zero)
    assert out.tolist() == [[1.0, -4.0, 2.0, -2.0]]


def test_frequency_and_presence_penalties_subtract_per_count_and_once():
    logits = torch.zeros(2, 3)
    counts = torch.tensor([[0.0, 1.0, 3.0], [2.0, 0.0, 0.0]])
    one, seen = torch.ones(2, 1), torch.zeros(2, 3, dtype=torch.bool)
    out = apply_penalties(
        logits, seen, counts, one, torch.tensor([[0.5], [0.0]]), torch.tensor([[1.0], [0.25]])
    )
    assert out.tolist() == [[0.0, -1.5, -2.5], [-0.25, 0.0, 0.0]]


@pytest.mark.parametrize("vocab", [4096, 799, 50])
def test_inverse_cdf_in_two_levels_picks_what_a_full_cumsum_picks(vocab):
    g = torch.Generator().manual_seed(vocab)
    weights = torch.rand(300, vocab, generator=g) ** 4
    weights[:, ::3] = 0  # filtered tokens: never picked
    u = torch.rand(300, generator=g)
    cdf = weights.cumsum(-1)
    want = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    got = inverse_cdf(weights, u)
    assert (got != want).sum() <= 1  # a u on a boundary may round either way
    assert (weights.gather(-1, got[:, None]) > 0).all()
    edges = inverse_cdf(weights[:2], torch.tensor([0.0, 1 - 2**-24]))
    assert edges[0] == int((weights[0] > 0).nonzero()[0]) and weights[1, edges[1]] > 0
