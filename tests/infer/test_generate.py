import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.infer import generate, stream
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.model import ModelConfig, Transformer


@pytest.fixture
def model() -> Transformer:
    config = ModelConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=4, max_seq_len=24)
    return Transformer(config)


def greedy_reference(model: Transformer, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt) :]


def test_greedy_matches_a_loop_of_full_forwards(model):
    prompt = [5, 17, 3]
    expected = greedy_reference(model.eval(), prompt, 12)
    assert generate(model, prompt, 12, temperature=0) == expected


def test_seeded_sampling_is_reproducible_and_equals_the_engine(model):
    a = generate(model, [1, 2], 15, seed=7)
    assert a == generate(model, [1, 2], 15, seed=7)
    assert a != generate(model, [1, 2], 15, seed=8)

    class Ids:
        special_tokens = {}  # noqa: RUF012

        def token_bytes(self, token):
            return b""

    with Engine(model, Ids(), max_batch_size=4) as engine:  # the same path, batched
        batched = engine.generate([[9], [1, 2], [3]], SamplingParams(max_tokens=15, seed=7))
    assert batched[1].token_ids == a


def test_generate_is_list_of_stream(model):
    it = stream(model, [4], 5, seed=3, top_k=10)
    assert next(it) == generate(model, [4], 5, seed=3, top_k=10)[0]
    assert [next(it), *it] == generate(model, [4], 5, seed=3, top_k=10)[1:]


def test_stop_id_is_yielded_last(model):
    free = generate(model, [9, 9], 10, temperature=0)
    stop = free[3]
    first = free.index(stop)
    assert generate(model, [9, 9], 10, temperature=0, stop_ids={stop}) == free[: first + 1]


def test_stops_when_context_is_full(model):
    assert len(generate(model, list(range(20)), 50, temperature=0)) == 24 - 20


def test_long_prompt_keeps_its_last_tokens(model):
    prompt = list(range(60))
    out = generate(model, prompt, 5, temperature=0)
    assert out == generate(model, prompt[-23:], 5, temperature=0)
    assert len(out) == 1  # 23 prompt tokens + 1 new fill the 24-token context


def test_restores_training_mode_and_leaves_grad_mode_alone(model):
    model.train()
    it = stream(model, [1], 3)
    next(it)
    assert model.training
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    list(it)
    model.eval()
    generate(model, [1], 3)
    assert not model.training


def test_empty_prompt_is_an_error(model):
    with pytest.raises(LmforgeError, match="endoftext"):
        stream(model, [], 5)


def test_bad_sampling_args_fail_before_the_first_token(model):
    with pytest.raises(LmforgeError, match="top_p"):
        stream(model, [1], 5, top_p=2.0)
