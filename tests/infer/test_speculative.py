"""Speculative decoding: drafts change how many forwards decoding takes, never what it gives."""

import copy

import pytest
import torch

from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.sampler import SamplingBatch
from lmforge.infer.scheduler import Sequence
from lmforge.infer.speculative import NgramProposer, accept
from lmforge.model import ModelConfig, Transformer

EOT = 256


class ByteTokenizer:
    def __init__(self) -> None:
        self.special_tokens = {"<|endoftext|>": EOT}

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if token < 256 else b"<|endoftext|>"


def tiny(seed: int, d_model: int = 32, n_layers: int = 2) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=257, d_model=d_model, n_layers=n_layers, n_heads=4, n_kv_heads=2,
        max_seq_len=128,
    )  # fmt: skip
    return Transformer(config).eval()


@pytest.fixture(scope="module")
def model() -> Transformer:
    return tiny(0)


# Repetitive prompts: prompt lookup finds drafts, and the model's greedy text loops.
PROMPTS = [[1, 2, 3, 4] * 5, [9, 8, 7] * 4, [5, 6] * 9, [40, 41, 42, 43, 44, 40, 41]]


def count_forwards(model):
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    return calls, handle


def test_prompt_lookup_drafts_what_followed_the_latest_earlier_occurrence():
    proposer = NgramProposer(k=3, max_n=2)
    seq = Sequence([1, 2, 3, 9, 1, 2, 4, 5, 1, 2])
    assert proposer.propose([seq], 3) == [[4, 5, 1]]  # "1 2" last seen before "4 5"
    seq.tokens += [4]  # the index follows new tokens
    assert proposer.propose([seq], 2) == [[5, 1]]
    assert proposer.propose([Sequence([7, 8, 9])], 3) == [[]]  # nothing to look up


# "other model": an untrained draft that (almost) never agrees; every token is then the model's.
@pytest.mark.parametrize("draft", ["ngram", "model", "other model"])
def test_greedy_output_is_identical_with_drafts(model, draft):
    speculative = {"ngram": "ngram", "model": copy.deepcopy(model), "other model": tiny(1, 16, 1)}
    params = SamplingParams(max_tokens=30, temperature=0)
    with Engine(model, ByteTokenizer(), max_batch_size=4) as engine:
        plain = engine.generate(PROMPTS, params)
    calls, handle = count_forwards(model)
    with Engine(model, ByteTokenizer(), max_batch_size=4, speculative=speculative[draft]) as engine:
        drafted = engine.generate(PROMPTS, params)
        one = engine.generate(PROMPTS[:1], params)  # batch 1 as well
        rate = engine.acceptance_rate
    handle.remove()
    assert [c.token_ids for c in drafted] == [c.token_ids for c in plain]
    assert one[0].token_ids == plain[0].token_ids
    assert all(c.finish_reason == "length" for c in drafted)  # exactly max_tokens, never more
    if draft == "ngram":  # the prompts repeat themselves, and so does the model
        assert rate > 0
    if draft == "model":  # the model's own drafts are always right
        assert rate == 1.0
        assert len(calls) < 30  # 30 tokens of 4 + 1 requests in far fewer forwards


def test_stops_inside_an_accepted_run_end_the_request_there(model):
    params = SamplingParams(max_tokens=30, temperature=0)
    with Engine(model, ByteTokenizer()) as engine:
        plain = engine.generate(PROMPTS[:1], params)[0].token_ids
    stop = plain[7]
    stopping = SamplingParams(max_tokens=30, temperature=0, stop_ids=(stop,))
    with Engine(model, ByteTokenizer(), speculative=copy.deepcopy(model)) as engine:
        got = engine.generate(PROMPTS[:1], stopping)[0]
    assert got.token_ids == plain[: plain.index(stop) + 1] and got.finish_reason == "stop"


class Row:
    """A request as the sampler sees it, with its own generator."""

    def __init__(self, params: SamplingParams, seed: int) -> None:
        self.params = params
        self.seen = self.counts = None
        self.generator = torch.Generator().manual_seed(seed)

    def uniform(self) -> float:
        return float(torch.rand(1, generator=self.generator))


@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.7, top_k=3)])
def test_accepting_drafts_keeps_the_distribution_of_plain_sampling(settings):
    """Rejection sampling against a deterministic draft: the first kept token has the request's
    own distribution p whatever was drafted, likely or not."""
    torch.manual_seed(0)
    vocab, n = 6, 4000
    logits = torch.randn(1, 3, vocab) * 1.5  # positions: after the newest token, after draft 1
    params = SamplingParams(**settings)
    scaled = logits[0, 0] / params.temperature
    if "top_k" in settings:
        scaled[scaled < scaled.topk(settings["top_k"]).values[-1]] = -float("inf")
    p = scaled.softmax(dim=-1)
    for draft in (int(p.argmax()), int(p.argmin())):  # a likely draft and a rejected one
        rows = [Row(params, seed) for seed in range(n)]
        batch = SamplingBatch.of(rows, vocab, torch.device("cpu"))
        kept, _ = accept(logits.expand(n, -1, -1), torch.tensor([[draft, 0]] * n), batch)
        first = torch.bincount(torch.tensor([k[0] for k in kept]), minlength=vocab) / n
        assert torch.allclose(first, p, atol=0.03), (draft, first, p)
