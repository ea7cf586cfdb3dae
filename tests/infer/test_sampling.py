import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.infer import sample_next_token


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
