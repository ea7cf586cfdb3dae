"""Scoring over the engine's prefix cache: contexts that begin alike compute their beginning once,
later jobs reuse it, and every score equals scoring each context whole."""

import copy
import time

import pytest
import torch

from lmforge.infer.cached_score import score_over_cache
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.score import score
from lmforge.model import Transformer
from tests.infer.scoring_model import scoring_model

BLOCK = 16
PREFIX = 40  # two full blocks shared, and 8 tokens of a third


class NoSpecials:
    special_tokens: dict[str, int] = {}  # noqa: RUF012

    def token_bytes(self, token: int) -> bytes:
        return b"x"


@pytest.fixture(scope="module")
def model() -> Transformer:
    return scoring_model(max_seq_len=128)


def few_shot(seed: int, questions: int = 6, prefix_seed: int = 1) -> list[tuple[list, list]]:
    """Multiple-choice requests whose contexts all begin with the same PREFIX tokens (the
    examples of a few-shot task), then their own question; choices of 0 to 8 tokens, so some
    continuations are empty and some one token long. Plus three contexts that share nothing."""
    prefix = torch.randint(0, 97, (PREFIX,), generator=torch.Generator().manual_seed(prefix_seed))
    g = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> list[int]:
        n = int(torch.randint(low, high, (1,), generator=g))
        return torch.randint(0, 97, (n,), generator=g).tolist()

    out = []
    for _ in range(questions):
        context = prefix.tolist() + draw(1, 30)
        out += [(context, draw(0, 9)) for _ in range(4)]
    return out + [(draw(1, 12), draw(1, 6)) for _ in range(3)]


def assert_same_scores(got, want, atol=1e-5):
    for g, w in zip(got, want, strict=True):
        assert g.logprobs == pytest.approx(w.logprobs, abs=atol)
        assert g.greedy == w.greedy
        assert [[t for t, _ in top] for top in g.top or []] == [
            [t for t, _ in top] for top in w.top or []
        ]


def count_computed(engine: Engine) -> list[int]:
    """The context tokens each forward over the cache computes (its rows' trunks), recorded."""
    computed = []
    extend = engine.runner.extend

    def spy(tables, positions, tokens, logits_at=None, branches=None, commit=True):
        trunks = map(len, tokens) if branches is None else (row.count(0) for row in branches)
        computed.append(sum(trunks))
        return extend(tables, positions, tokens, logits_at, branches, commit)

    engine.runner.extend = spy
    return computed


@pytest.mark.parametrize("relayout", [False, True])
def test_scores_over_the_cache_equal_scoring_each_context_whole(model, relayout):
    requests = few_shot(0)
    want = score(model, requests, top_n=3)
    with Engine(copy.deepcopy(model), NoSpecials(), relayout_weights=relayout) as engine:
        first = engine.score(requests, top_n=3)
        again = engine.score(requests, top_n=3)  # every context's full blocks cached now
    assert_same_scores(first, want, atol=1e-4)
    assert_same_scores(again, want, atol=1e-4)


def test_a_shared_beginning_is_computed_once_and_later_jobs_reuse_it(model):
    requests = few_shot(0)
    contexts = list(dict.fromkeys(tuple(c) for c, _ in requests[:-3]))
    shared = PREFIX // BLOCK * BLOCK
    with Engine(model, NoSpecials(), block_size=BLOCK) as engine:
        computed = count_computed(engine)
        engine.score(requests)
        # the shared blocks once, then each context's own tokens; the three contexts that
        # share nothing are scored whole (score.py), not over the cache
        assert sum(computed) == shared + sum(len(c) - shared for c in contexts)
        computed.clear()
        pool = engine.scheduler.pool
        hits = pool.hit_tokens
        later = few_shot(1)  # new questions after the same examples
        got = engine.score(later)
        new_contexts = list(dict.fromkeys(tuple(c) for c, _ in later[:-3]))
        assert sum(computed) == sum(len(c) - shared for c in new_contexts)
        assert pool.hit_tokens - hits >= shared * len(new_contexts)
    assert_same_scores(got, score(model, later))


def test_scoring_without_prefix_caching_computes_every_context_whole(model):
    requests = few_shot(0)
    with Engine(model, NoSpecials(), prefix_caching=False) as engine:
        computed = count_computed(engine)
        got = engine.score(requests, top_n=2)
    assert computed == []  # nothing went over the cache
    assert_same_scores(got, score(model, requests, top_n=2))


def test_a_pool_too_small_for_a_context_scores_it_whole_and_holds_nothing_after(model):
    requests = few_shot(0)
    want = score(model, requests)
    with Engine(model, NoSpecials(), max_batch_size=1, max_kv_tokens=2 * BLOCK) as engine:
        got = engine.score(requests)
        pool = engine.scheduler.pool
        assert pool.n_free == pool.capacity  # every block given back
    assert_same_scores(got, want)


def test_scoring_between_decode_steps_leaves_the_requests_tokens_unchanged(model):
    requests = few_shot(0)
    params = SamplingParams(max_tokens=40, temperature=0)
    prompts = [requests[0][0][:30], [5, 6, 7]]  # the first begins with the scored blocks
    with Engine(model, NoSpecials(), max_batch_size=2) as engine:
        want = [c.token_ids for c in engine.generate(prompts, params)]
    slow = copy.deepcopy(model)
    slow.register_forward_hook(lambda *_: time.sleep(0.005))  # 40 decode steps take 0.2 s+
    with Engine(slow, NoSpecials(), max_batch_size=2) as engine:
        handles = [engine.submit(p, params) for p in prompts]
        next(iter(handles[0]))  # decoding is under way
        scored = engine.score(requests)
        in_flight = len(handles[0]._events)  # delivered, not yet read, when scoring ended
        got = [h.result().token_ids for h in handles]
    assert 0 < in_flight < 39  # scored between decode steps
    assert got == want
    assert_same_scores(scored, score(model, requests))


def test_blocks_cached_by_scoring_hold_the_draft_models_keys_too(model):
    """A draft model equal to the model drafts exactly what it picks, so every draft is kept,
    unless the draft's keys and values for a cached block were never computed."""
    requests = few_shot(0)
    prompt = requests[0][0] + requests[0][1]  # begins with blocks the scoring job cached
    params = SamplingParams(max_tokens=12, temperature=0)
    with Engine(model, NoSpecials()) as engine:
        want = engine.generate([prompt], params)[0].token_ids
    with Engine(model, NoSpecials(), speculative=copy.deepcopy(model)) as engine:
        engine.score(requests)
        hits = engine.scheduler.pool.hit_tokens
        got = engine.generate([prompt], params)[0].token_ids
        assert engine.scheduler.pool.hit_tokens > hits
        assert engine.acceptance_rate == 1.0
    assert got == want


def test_contexts_that_fill_the_window_are_scored_whole(model):
    """No position is left after such a context for a padding branch: score.py's trees."""
    limit = model.config.max_seq_len
    requests = [([3] * limit, [4]), ([3] * limit, [5]), ([3] * 20, [6, 7])]
    with Engine(model, NoSpecials()) as engine:
        computed = count_computed(engine)
        got = engine.score(requests, top_n=2)
    assert computed == []
    assert_same_scores(got, score(model, requests, top_n=2))


def test_rows_are_packed_by_the_token_budget_and_equal_scoring_whole(model):
    requests = few_shot(0, questions=9)
    with Engine(model, NoSpecials()) as engine:
        got = score_over_cache(engine.runner, engine.scheduler, requests, 2, batch_tokens=64)
    assert_same_scores(got, score(model, requests, top_n=2))


def test_forwards_hold_the_token_budget_and_the_gather_budget(model, monkeypatch):
    import lmforge.infer.runner as runner_module

    with Engine(model, NoSpecials()) as engine:
        runner = engine.runner
        position = runner.cache.position_bytes
        monkeypatch.setattr(runner_module, "GATHER_BYTES", 100 * position)
        lengths, ends = [30, 5, 30, 5, 1, 2], [40, 100, 35, 20, 10, 12]
        groups = runner.forwards(lengths, ends, max_tokens=64)
    assert sorted(i for g in groups for i in g) == list(range(6))
    for group in groups:
        width = max(lengths[i] for i in group)
        assert len(group) == 1 or len(group) * width <= 64
        assert len(group) == 1 or len(group) * max(ends[i] for i in group) <= 100
    assert [0, 2] in groups  # the two 30-token rows, 75 positions gathered at most
