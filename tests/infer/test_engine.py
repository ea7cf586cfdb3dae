import asyncio
import codecs
import copy
import threading
import time

import pytest
import torch
from torch._dynamo.utils import counters

from lmforge.device.capability import DECODE_ISAS, cpu_capability, detect
from lmforge.errors import LmforgeError
from lmforge.infer import generate
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.kv_cache import PagedKVCache
from lmforge.infer.sampling import apply_penalties
from lmforge.infer.score import score
from lmforge.infer.weight_layouts import PackedLinear, StreamedLinear
from lmforge.model import ModelConfig, Transformer
from lmforge.threads import using_threads

EOT = 256


class LetterTokenizer:
    """Token i is the letter chr(97 + i % 26): text that is easy to read and cut."""

    def __init__(self) -> None:
        self.special_tokens = {"<|endoftext|>": EOT}

    def token_bytes(self, token: int) -> bytes:
        return bytes([97 + token % 26])


class ByteTokenizer:
    """Token i < 256 is the byte i; 256 is <|endoftext|>."""

    def __init__(self) -> None:
        self.special_tokens = {"<|endoftext|>": EOT}

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if token < 256 else b"<|endoftext|>"


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=257, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64
    )
    return Transformer(config).eval()


PROMPTS = [[1, 2, 3], [5] * 10, [7, 8], list(range(30, 50)), [4, 4, 4, 4], [3], [9, 9, 9]]


def one_at_a_time(model, prompts, params):
    with Engine(model, ByteTokenizer(), max_batch_size=1) as engine:
        return [engine.generate([p], s)[0] for p, s in zip(prompts, params, strict=True)]


@torch.no_grad()
@pytest.mark.parametrize("paged_kernel", [True, False], ids=["paged-kernel", "gathered"])
def test_chunked_prefill_then_batched_decode_over_scattered_blocks_equals_a_full_forward(
    model, paged_kernel
):
    """Decode steps attend through the tables with the paged-attention kernel where it runs,
    else over a gathered copy: both equal a full forward."""
    cache = PagedKVCache(model, n_blocks=12, block_size=4)
    if not paged_kernel:
        cache.attention_isa = None
    elif cache.attention_isa is None:
        pytest.skip("no decode kernel runs on this machine (the gathered case runs)")
    seqs = [torch.randint(0, 257, (n,)).tolist() for n in (7, 13, 9)]
    tables = [[5, 2, 9, 0], [1, 11, 3, 8], [4, 10, 7, 6]]  # blocks in no order, 0 among them
    lengths = [3, 11, 1]
    for seq, table, n in zip(seqs, tables, lengths, strict=True):
        for start, end in ((0, n // 2), (n // 2, n)):  # a prompt in two chunks
            if start == end:
                continue
            cache.bind([table], start, end - start)
            logits = model(torch.tensor([seq[start:end]]), cache, last_only=True)[:, -1]
            cache.commit()
        torch.testing.assert_close(
            logits, model(torch.tensor([seq[:n]]))[:, -1], atol=1e-5, rtol=1e-5
        )
    positions = list(lengths)
    for _ in range(2):  # every row one token further, each at its own position
        cache.bind(tables, positions, 1)
        tokens = torch.tensor([[seq[p]] for seq, p in zip(seqs, positions, strict=True)])
        logits = model(tokens, cache)[:, -1]
        cache.commit()
        positions = [p + 1 for p in positions]
        for row, seq in enumerate(seqs):
            full = model(torch.tensor([seq[: positions[row]]]))[:, -1]
            torch.testing.assert_close(logits[row : row + 1], full, atol=1e-5, rtol=1e-5)


def test_greedy_equals_the_reference_generate(model):
    params = SamplingParams(max_tokens=12, temperature=0)
    with Engine(model, ByteTokenizer(), max_batch_size=3) as engine:
        results = engine.generate(PROMPTS, params)
    for prompt, result in zip(PROMPTS, results, strict=True):
        expected = generate(model, prompt, 12, temperature=0, stop_ids={EOT})
        assert result.token_ids == expected
        assert result.prompt_tokens == len(prompt)


def spy_on_steps(engine):
    """Record, after each scheduler step, (running requests, KV positions held, preempted)."""
    steps = []
    schedule = engine.scheduler.schedule

    def spy():
        step = schedule()
        steps.append((engine.busy_slots, engine.reserved_kv_tokens, len(step.preempted)))
        return step

    engine.scheduler.schedule = spy
    return steps


def test_continuous_batching_equals_one_at_a_time_under_a_kv_cap(model):
    mixed = [
        SamplingParams(max_tokens=6 + i, temperature=0 if i % 2 else 0.9, seed=i, top_k=50)
        for i in range(len(PROMPTS))
    ]
    engine = Engine(model, ByteTokenizer(), max_batch_size=4, max_kv_tokens=60)
    assert engine.max_kv_tokens == 48  # whole blocks of 16 under the cap
    steps = spy_on_steps(engine)
    with engine:
        batched = engine.generate(PROMPTS, mixed)
    assert [r.token_ids for r in batched] == [
        r.token_ids for r in one_at_a_time(model, PROMPTS, mixed)
    ]
    assert max(n for n, _, _ in steps) >= 2  # requests did share the batch
    assert max(n for n, _, _ in steps) < 4  # but the KV pool, not the batch size, limited them
    assert all(held <= 48 for _, held, _ in steps)
    assert engine.reserved_kv_tokens == 0 and engine.busy_slots == 0


def test_a_full_pool_preempts_and_every_request_still_finishes_exactly(model):
    prompts = [[i + 1] * 5 for i in range(4)]
    params = [SamplingParams(20, temperature=0 if i % 2 else 0.8, seed=i) for i in range(4)]
    # Each request ends up holding 7 blocks of 4; admitted on 2 each, the 4 outgrow 11.
    engine = Engine(model, ByteTokenizer(), max_batch_size=4, max_kv_tokens=44, block_size=4)
    steps = spy_on_steps(engine)
    with engine:
        together = engine.generate(prompts, params)
    assert sum(preempted for _, _, preempted in steps) > 0
    assert all(c.finish_reason == "length" for c in together)
    assert [c.token_ids for c in together] == [
        c.token_ids for c in one_at_a_time(model, prompts, params)
    ]
    assert engine.reserved_kv_tokens == 0 and engine.busy_slots == 0


def test_samples_of_one_prompt_share_its_prefill_and_equal_separate_requests(model):
    prompt = PROMPTS[0]
    params = [SamplingParams(12, temperature=1.0, seed=s, logprobs=True) for s in range(6)]
    with Engine(model, ByteTokenizer(), max_batch_size=8) as engine:
        forwards = []
        handle = model.register_forward_hook(lambda m, args, out: forwards.append(args[0].shape))
        with engine._wake:  # the scheduler waits: all six are admitted in one round
            handles = [engine.submit(prompt, p) for p in params]
        together = [h.result() for h in handles]
        handle.remove()
        alone = [engine.generate([prompt], p)[0] for p in params]
    prefills = [shape for shape in forwards if shape[1] > 1]
    assert len(prefills) == 1  # the other five copied the first one's keys and values
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert len({tuple(c.token_ids) for c in together}) > 1  # each sampled on its own seed
    for a, b in zip(together, alone, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_seeded_sampling_is_reproducible_and_seed_dependent(model):
    with Engine(model, ByteTokenizer(), max_batch_size=2) as engine:
        a, b, c = engine.generate([[1, 2]] * 3, [SamplingParams(20, seed=s) for s in (7, 7, 8)])
    assert a.token_ids == b.token_ids != c.token_ids


def test_logprobs_are_log_softmax_of_a_full_forward(model):
    params = SamplingParams(max_tokens=8, temperature=0.8, seed=1, logprobs=True)
    with Engine(model, ByteTokenizer(), max_batch_size=2) as engine:
        results = engine.generate([[1, 2, 3], [40, 41]], params)
    for prompt, result in zip([[1, 2, 3], [40, 41]], results, strict=True):
        ids = torch.tensor([prompt + result.token_ids])
        with torch.no_grad():
            logp = model(ids)[0, len(prompt) - 1 : -1].log_softmax(-1)
        expected = logp.gather(-1, torch.tensor(result.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(result.logprobs), expected, atol=1e-5, rtol=0)


def test_top_logprobs_are_the_likeliest_tokens_of_a_full_forward(model):
    params = [
        SamplingParams(max_tokens=6, temperature=0.8, seed=2, logprobs=True, top_logprobs=k)
        for k in (3, 0)
    ]
    with Engine(model, ByteTokenizer(), max_batch_size=2) as engine:
        top3, plain = engine.generate([[1, 2, 3], [40, 41]], params)
        events = list(engine.submit([1, 2, 3], params[0]))
        assert all(e.top is None for e in engine.submit([4], params[1]))
    assert plain.top_logprobs is None
    streamed = [e.top for e in events]  # alone in the batch: the same up to rounding
    assert [[t for t, _ in top] for top in streamed] == [
        [t for t, _ in top] for top in top3.top_logprobs
    ]
    ids = torch.tensor([[1, 2, 3, *top3.token_ids]])
    with torch.no_grad():
        logp = model(ids)[0, 2:-1].log_softmax(-1)
    values, expected = logp.topk(3, dim=-1)
    for top, want_ids, want in zip(top3.top_logprobs, expected.tolist(), values, strict=True):
        assert [t for t, _ in top] == want_ids
        torch.testing.assert_close(torch.tensor([v for _, v in top]), want, atol=1e-5, rtol=0)


def test_penalties_follow_the_reference_loop(model):
    params = SamplingParams(
        max_tokens=15,
        temperature=0,
        repetition_penalty=1.5,
        frequency_penalty=0.7,
        presence_penalty=0.3,
    )
    prompt = [5, 6, 5]
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(15):
            logits = model(torch.tensor([ids]))[:, -1]
            seen = torch.zeros(1, 257, dtype=torch.bool)
            seen[0, ids] = True
            counts = torch.zeros(1, 257)
            for token in out:
                counts[0, token] += 1
            column = [torch.tensor([[v]]) for v in (1.5, 0.7, 0.3)]
            out.append(int(apply_penalties(logits, seen, counts, *column).argmax()))
            ids.append(out[-1])
    with Engine(model, ByteTokenizer(), max_batch_size=2) as engine:
        penalised, plain = engine.generate(
            [prompt, prompt], [params, SamplingParams(max_tokens=15, temperature=0)]
        )
    assert penalised.token_ids == out[: len(penalised.token_ids)]
    assert penalised.token_ids != plain.token_ids


@pytest.mark.parametrize(
    "settings", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0), dict(temperature=1e-4)]
)
def test_sampling_that_keeps_only_the_top_token_is_greedy(model, settings):
    greedy = SamplingParams(max_tokens=10, temperature=0)
    narrow = SamplingParams(max_tokens=10, seed=3, **{"temperature": 1.5, **settings})
    with Engine(model, ByteTokenizer(), max_batch_size=2) as engine:
        a, b = engine.generate([[1, 2, 3]] * 2, [greedy, narrow])
    assert a.token_ids == b.token_ids


def test_stop_ids_and_max_tokens(model):
    with Engine(model, ByteTokenizer(), max_batch_size=2) as engine:
        free = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=12, temperature=0))[0]
        stop = free.token_ids[4]
        stopped = engine.generate(
            [[1, 2, 3]], SamplingParams(max_tokens=12, temperature=0, stop_ids=(stop,))
        )[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    first = free.token_ids.index(stop)
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[:first]


def test_stop_string_across_tokens_is_cut_and_never_streamed(model):
    params = SamplingParams(max_tokens=20, temperature=0)
    with Engine(model, LetterTokenizer(), max_batch_size=2) as engine:
        free = engine.generate([[1, 2, 3]], params)[0]
        stop = free.text[5:8]  # three one-letter tokens
        cut = free.text.index(stop)
        params = SamplingParams(max_tokens=20, temperature=0, stop=("never", stop))
        events = list(engine.submit([1, 2, 3], params))
    assert [e.token_id for e in events] == free.token_ids[: cut + 3]
    assert [e.finish_reason for e in events] == [None] * (cut + 2) + ["stop"]
    assert "".join(e.text for e in events) == free.text[:cut]
    assert events[-1].text == ""  # the stop string's letters were held back, then dropped


def test_streamed_text_assembles_utf8_across_tokens(model):
    params = SamplingParams(max_tokens=30, temperature=1.5, seed=11)
    with Engine(model, ByteTokenizer(), max_batch_size=2) as engine:
        handle = engine.submit([0xC3, 0xA9, 0xE2, 0x82], params)
        events = list(handle)
        result = handle.result()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    expected = decoder.decode(bytes(result.token_ids)) + decoder.decode(b"", final=True)
    assert "".join(e.text for e in events) == result.text == expected
    assert [e.token_id for e in events] == result.token_ids


def test_multibyte_characters_never_split_in_a_stream():
    config = ModelConfig(vocab_size=257, d_model=16, n_layers=1, n_heads=2, max_seq_len=32)
    model = Transformer(config).eval()
    with torch.no_grad():  # a model that always says "é" = C3 A9, one byte per token
        model.output.weight.zero_()
        model.tok_embeddings.weight.zero_()
        model.tok_embeddings.weight[:, 0] = torch.arange(257) == 0xC3
        model.tok_embeddings.weight[:, 1] = 1.0
        model.output.weight[0xC3, 1] = 1.0  # after anything else: C3
        model.output.weight[0xA9, 0] = 10.0  # after C3: A9
        for p in model.layers.parameters():  # blocks add nothing: the last token decides
            p.zero_()
    with Engine(model, ByteTokenizer(), max_batch_size=1) as engine:
        events = list(engine.submit([1], SamplingParams(max_tokens=6, temperature=0)))
    assert [e.token_id for e in events] == [0xC3, 0xA9] * 3
    assert [e.text for e in events] == ["", "é"] * 3


def test_cancel_frees_the_slot_for_the_next_request(model):
    engine = Engine(model, ByteTokenizer(), max_batch_size=1)
    long = engine.submit([1, 2], SamplingParams(max_tokens=60, temperature=0))
    waiting = engine.submit([3], SamplingParams(max_tokens=5, temperature=0))
    first = next(iter(long))
    long.cancel()
    events = list(long)
    assert events[-1].finish_reason == "abort" and first.finish_reason is None
    assert long.result().finish_reason == "abort"
    assert len(long.result().token_ids) < 60
    assert waiting.result().finish_reason == "length"
    queued = engine.submit([3], SamplingParams(max_tokens=5, temperature=0))
    queued.cancel()
    assert queued.result().finish_reason in ("abort", "length")
    engine.close()
    assert engine.reserved_kv_tokens == 0 and engine.busy_slots == 0


def test_async_iteration_yields_the_same_events(model):
    params = SamplingParams(max_tokens=10, temperature=0.7, seed=5)

    async def collect(engine):
        handles = [engine.submit([1, 2, 3], params), engine.submit([4], params)]
        streams = []
        for handle in handles:
            streams.append([e async for e in handle])
        return streams

    with Engine(model, ByteTokenizer(), max_batch_size=2) as engine:
        streamed = asyncio.run(collect(engine))
        again = [list(engine.submit(p, params)) for p in ([1, 2, 3], [4])]
    assert streamed == again
    assert all(events[-1].finish_reason == "length" for events in streamed)


def test_compiled_decode_step_gives_the_same_tokens_compiling_once_per_row_count():
    # Keys attended grow from 3 to 41 and the batch shrinks from 2 rows to 1. One layer:
    # compile time grows with the graph, and two compiles are the test's whole cost.
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=257, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2)
    model = Transformer(config).eval()
    params = [SamplingParams(max_tokens=40, temperature=0), SamplingParams(max_tokens=8, seed=3)]
    prompts = [[1, 2], [3, 4, 5, 6]]
    tokenizer = ByteTokenizer()
    tokenizer.special_tokens = {}  # every request runs to max_tokens
    with Engine(model, tokenizer, max_batch_size=2) as engine:
        eager = engine.generate(prompts, params)
    counters.clear()
    # two threads: the 1-row step's first steps are timed at 2 threads, then at 1 (ThreadTrial)
    with using_threads(2), Engine(model, tokenizer, max_batch_size=2, compile=True) as engine:
        compiled = engine.generate(prompts, params)
        assert engine.runner.thread_trials[1].times.keys() == {1, 2}
    assert [r.token_ids for r in compiled] == [r.token_ids for r in eager]
    assert counters["stats"]["unique_graphs"] == 2  # not one per context length or thread count


@pytest.mark.parametrize(
    "prompt, settings, word",
    [
        ([], {}, "empty"),
        ([1, 999], {}, "vocabulary"),
        ([1] * 60, dict(max_tokens=10), "context"),
        ([1], dict(max_tokens=0), "max_tokens"),
        ([1], dict(temperature=-1), "temperature"),
        ([1], dict(min_p=2.0), "min_p"),
        ([1], dict(repetition_penalty=0), "repetition_penalty"),
        ([1] * 20, dict(max_tokens=20), "max_kv_tokens"),
    ],
)
def test_bad_requests_are_refused_at_submit(model, prompt, settings, word):
    with (
        Engine(model, ByteTokenizer(), max_kv_tokens=32) as engine,
        pytest.raises(LmforgeError, match=word),
    ):
        engine.submit(prompt, SamplingParams(**settings))


def test_closed_engine_refuses_requests(model):
    engine = Engine(model, ByteTokenizer())
    engine.close()
    with pytest.raises(LmforgeError, match="closed"):
        engine.submit([1], SamplingParams())


HOST_DECODE_ISA = cpu_capability().decode_isa


# neon and arm-bf16 force the choices of a CPU where lmforge's decode kernels do not run
@pytest.mark.parametrize(
    ("slots", "dtype", "compile", "layout", "profile"),
    [
        (1, torch.float32, False, HOST_DECODE_ISA or "column-major", None),
        (1, torch.bfloat16, True, "avx2", "avx2"),  # one compile: the kernels take any rows
        (1, torch.float32, False, "column-major", "neon"),
        (1, torch.float32, True, "streamed", "neon"),
        (2, torch.bfloat16, True, "streamed", "arm-bf16"),
        (4, torch.float32, False, "packed", "neon"),
        (4, torch.float32, True, "packed", "neon"),
        (4, torch.bfloat16, False, "packed", "arm-bf16"),
        (16, torch.bfloat16, False, "row-major", "avx2"),  # the fallback where bf16 won't pack
        (4, torch.float32, False, "row-major", "generic"),
    ],
)
def test_relaid_weights_give_the_same_tokens(
    model, monkeypatch, slots, dtype, compile, layout, profile
):
    if profile:
        monkeypatch.setenv("LMFORGE_CPU_PROFILE", profile)
    if layout == "packed" and not detect().can_pack(dtype):
        pytest.skip(
            f"oneDNN cannot pack {dtype} weights on this CPU; the avx2-profile case below "
            "tests the fallback this CPU takes"
        )
    model = copy.deepcopy(model).to(dtype)
    relaid = copy.deepcopy(model)
    params = SamplingParams(max_tokens=12, temperature=0)
    prompts = PROMPTS[:slots]
    engine = Engine(
        relaid, ByteTokenizer(), max_batch_size=slots, compile=compile, relayout_weights=True
    )
    with engine:
        assert engine.weight_layout == layout
        got = engine.generate(prompts, params)
    with Engine(model, ByteTokenizer(), max_batch_size=slots) as engine:
        assert engine.weight_layout == "row-major"
        want = engine.generate(prompts, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    if layout == "column-major":
        weight = relaid.layers[0].attn.q_proj.weight
        assert weight.stride() == (1, weight.shape[0])  # (out, in) stored as a contiguous (in, out)
        assert torch.equal(weight, model.layers[0].attn.q_proj.weight)
    elif layout == "streamed":
        assert isinstance(relaid.layers[0].attn.q_proj, StreamedLinear)
    elif layout == "packed":
        assert isinstance(relaid.layers[0].attn.q_proj, PackedLinear)
    elif layout in DECODE_ISAS:
        assert relaid.layers[0].attn.q_proj.isa == layout
    else:
        assert relaid.layers[0].attn.q_proj.weight.is_contiguous()


SCORE_REQUESTS = [([1, 2, 3], [4, 5]), ([1, 2, 3], [9]), ([7], [8, 9, 10, 11]), ([5] * 12, [])]


def assert_same_scores(got, want, atol=1e-5):
    for g, w in zip(got, want, strict=True):
        assert g.logprobs == pytest.approx(w.logprobs, abs=atol)
        assert g.greedy == w.greedy
        assert [[t for t, _ in top] for top in g.top] == [[t for t, _ in top] for top in w.top]


@pytest.mark.parametrize("relayout", [False, True])
def test_engine_score_equals_score_on_the_bare_model(model, relayout):
    want = score(model, SCORE_REQUESTS, top_n=4)
    with Engine(copy.deepcopy(model), ByteTokenizer(), relayout_weights=relayout) as engine:
        assert_same_scores(engine.score(SCORE_REQUESTS, top_n=4), want, atol=1e-4)


def test_scoring_interleaves_with_running_requests_and_both_stay_exact(model):
    slow = copy.deepcopy(model)
    slow.register_forward_hook(lambda *_: time.sleep(0.005))  # 60 decode steps take 0.3 s+
    params = SamplingParams(max_tokens=60, temperature=0)
    want_scores = score(model, SCORE_REQUESTS, top_n=2)
    with Engine(model, ByteTokenizer(), max_batch_size=2) as engine:
        want = engine.generate([[1, 2], [3, 4, 5]], params)

    async def both(engine):
        handles = [engine.submit([1, 2], params), engine.submit([3, 4, 5], params)]
        first = await anext(aiter(handles[0]))  # generation is under way
        scored = await asyncio.wrap_future(engine.submit_score(SCORE_REQUESTS, top_n=2))
        in_flight = len(handles[0]._events)  # the events delivered while scoring ran
        rest = await asyncio.gather(*(_drain(h) for h in handles))
        return first, scored, in_flight, rest

    with Engine(slow, ByteTokenizer(), max_batch_size=2) as engine:
        threaded = []
        thread = threading.Thread(target=lambda: threaded.append(engine.score(SCORE_REQUESTS)))
        thread.start()
        first, scored, in_flight, rest = asyncio.run(both(engine))
        thread.join()
    assert first.finish_reason is None and 0 < in_flight < 60  # scored between decode steps
    assert_same_scores(scored, want_scores)
    assert threaded[0][0].logprobs == pytest.approx(want_scores[0].logprobs, abs=1e-5)
    assert [[e.token_id for e in events] for events in rest] == [w.token_ids for w in want]


async def _drain(handle):
    return [event async for event in handle]


def test_scoring_errors_reach_the_caller_and_the_engine_goes_on(model, monkeypatch):
    import lmforge.infer.engine as engine_module

    with Engine(model, ByteTokenizer()) as engine:
        with pytest.raises(LmforgeError, match="vocabulary"):
            engine.score([([1], [999])])  # refused at submit: never reaches the model
        with pytest.raises(LmforgeError, match="empty context"):
            engine.score([([], [1])])
        with pytest.raises(LmforgeError, match="context"):
            engine.score([([1] * 60, [2] * 10)])

        def broken(*_args, **_kwargs):
            raise RuntimeError("out of memory")

        monkeypatch.setattr(engine_module, "score_over_cache", broken)
        future = engine.submit_score([([1], [2])])
        with pytest.raises(RuntimeError, match="out of memory"):
            future.result(timeout=10)
        monkeypatch.undo()
        assert engine.generate([[1, 2]], SamplingParams(max_tokens=3))[0].finish_reason
        assert engine.score([([1], [2])])[0].logprobs
    with pytest.raises(LmforgeError, match="closed"):
        engine.score([([1], [2])])
