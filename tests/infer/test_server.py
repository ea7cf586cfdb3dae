"""The OpenAI-compatible server live on loopback: the official client, bad input, disconnects, load.

A tiny random model serves through the real engine; greedy replies must equal what the engine
produces directly for the same prompt.
"""

import asyncio
import json
import time

import httpx
import openai
import pytest
import torch

from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.score import score
from lmforge.infer.server import create_app, running
from lmforge.infer.text import prompt_ids
from lmforge.model import ModelConfig, Transformer
from lmforge.tokenizer import Tokenizer
from lmforge.tokenizer.chat_template import ChatTemplate, Message
from lmforge.tokens.encode import document_start

MODEL = "tiny"
CONTEXT = 128


def tiny_model(vocab_size: int, max_seq_len: int = CONTEXT) -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=vocab_size, d_model=32, n_layers=2, n_heads=2, max_seq_len=max_seq_len
    )
    return Transformer(config).eval()


@pytest.fixture(scope="module")
def tokenizer(prepared):
    return Tokenizer.load(prepared.tokenizer_dir)


@pytest.fixture(scope="module")
def engine(tokenizer):
    with Engine(tiny_model(tokenizer.vocab_size), tokenizer, max_batch_size=8) as engine:
        yield engine


@pytest.fixture(scope="module")
def base_url(engine, tokenizer):
    with running(create_app(engine, tokenizer, MODEL)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", timeout=30, max_retries=0)


def direct(engine, ids, **params):
    return engine.generate([ids], SamplingParams(temperature=0, **params))[0]


def direct_chat(engine, tokenizer, messages, max_tokens):
    template = ChatTemplate(tokenizer)
    ids = template.prompt_ids([Message(**m) for m in messages])
    params = dict(stop=template.stop, stop_ids=template.stop_ids)
    result = direct(engine, ids, max_tokens=max_tokens, **params)
    return result, len(ids), result.text.removeprefix(template.reply_prefix)


def test_models_lists_the_served_model(client, engine):
    (card,) = client.models.list().data
    assert card.id == MODEL and card.owned_by == "lmforge"
    assert client.models.retrieve(MODEL).model_extra["max_model_len"] == engine.max_context


def test_greedy_completion_equals_the_engine(client, engine, tokenizer):
    reply = client.completions.create(model=MODEL, prompt="def main(", max_tokens=12, temperature=0)
    expected = direct(engine, prompt_ids(tokenizer, "def main("), max_tokens=12)
    (choice,) = reply.choices
    assert choice.text == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert reply.usage.prompt_tokens == expected.prompt_tokens
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.total_tokens == expected.prompt_tokens + len(expected.token_ids)


def test_streamed_completion_joins_to_the_same_text(client, engine, tokenizer):
    stream = client.completions.create(
        model=MODEL, prompt="import os\n", max_tokens=20, temperature=0, stream=True
    )
    chunks = list(stream)
    expected = direct(engine, prompt_ids(tokenizer, "import os\n"), max_tokens=20)
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert [c.choices[0].finish_reason for c in chunks][-1] == expected.finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert len(chunks) > 2


def test_greedy_chat_equals_the_engine_through_the_chat_template(client, engine, tokenizer):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is a list?"},
    ]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0
    )
    result, n_prompt, text = direct_chat(engine, tokenizer, messages, 16)
    (choice,) = reply.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == text
    assert choice.finish_reason == result.finish_reason
    assert reply.usage.prompt_tokens == n_prompt
    assert reply.usage.completion_tokens == len(result.token_ids)


def test_streamed_chat_sends_deltas_a_finish_chunk_and_usage(client, engine, tokenizer):
    messages = [{"role": "user", "content": "Hello!"}]
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    result, n_prompt, text = direct_chat(engine, tokenizer, messages, 24)
    *body, last = chunks
    assert body[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in body) == text
    assert body[-1].choices[0].finish_reason == result.finish_reason
    assert last.choices == [] and last.usage.prompt_tokens == n_prompt
    assert last.usage.completion_tokens == len(result.token_ids)


def test_prompt_lists_and_n_give_one_choice_each(client, engine, tokenizer):
    prompts = ["class A:", "x = 1\n"]
    reply = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=6, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    for i, prompt in enumerate(prompts):
        expected = direct(engine, prompt_ids(tokenizer, prompt), max_tokens=6).text
        assert [c.text for c in reply.choices[2 * i : 2 * i + 2]] == [expected, expected]
    ids = prompt_ids(tokenizer, prompts[0])  # a prompt of token ids is taken as is
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == reply.choices[0].text


def test_seeded_sampling_is_reproducible_and_takes_extra_knobs(client):
    def sample(seed):
        return client.completions.create(
            model=MODEL,
            prompt="for i in",
            max_tokens=16,
            temperature=1.0,
            top_p=0.9,
            frequency_penalty=0.5,
            seed=seed,
            extra_body={"top_k": 50, "min_p": 0.01, "repetition_penalty": 1.2},
        ).choices[0]

    assert sample(7).text == sample(7).text
    assert len({sample(s).text for s in range(4)}) > 1


def test_logprobs_of_the_chosen_tokens(client, engine, tokenizer):
    ids = prompt_ids(tokenizer, "while ")
    expected = direct(engine, ids, max_tokens=8, logprobs=True)
    reply = client.completions.create(
        model=MODEL, prompt="while ", max_tokens=8, temperature=0, logprobs=0
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs.token_logprobs == pytest.approx(expected.logprobs, abs=1e-5)
    assert len(logprobs.tokens) == len(expected.token_ids)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(item.logprob <= 0 for item in content)


def test_stop_strings_cut_the_text(client, engine, tokenizer):
    full = direct(engine, prompt_ids(tokenizer, "def main("), max_tokens=24).text
    stop = next(full[i : i + 2] for i in range(3, len(full) - 2) if full[i : i + 2].strip())
    reply = client.completions.create(
        model=MODEL, prompt="def main(", max_tokens=24, temperature=0, stop=[stop]
    )
    assert reply.choices[0].text == full[: full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def post(base_url, path, body, **kwargs):
    content = body if isinstance(body, str) else json.dumps(body)
    headers = {"content-type": "application/json"}
    return httpx.post(f"{base_url}{path}", content=content, headers=headers, timeout=30, **kwargs)


def completion(**fields):
    return ("/v1/completions", {"model": MODEL, "prompt": "x", **fields})


def chat(**fields):
    return ("/v1/chat/completions", {"model": MODEL, "messages": [USER], **fields})


USER = {"role": "user", "content": "x"}
TOO_SMALL = "greater than or equal to 1"


@pytest.mark.parametrize(
    "request_,status,param,message",
    [
        (("/v1/completions", '{"model": "tiny", "prompt": '), 400, None, "not valid JSON"),
        (("/v1/completions", "[1, 2]"), 400, None, "valid dictionary"),
        (("/v1/completions", {"prompt": "x"}), 400, "model", "Field required"),
        (completion(model="gpt-4"), 404, "model", "does not exist"),
        (completion(max_tokens=-5), 400, "max_tokens", "greater than or equal to 0"),
        (completion(max_tokens=0), 400, "max_tokens", "echo=true to score the prompt"),
        (completion(max_tokens=10**9), 400, "prompt", f"context window holds {CONTEXT} tokens"),
        (completion(temperature=7), 400, "temperature", "less than or equal to 2"),
        (completion(prompt=[999999]), 400, "prompt", "outside [0, 320)"),
        (completion(prompt=[]), 400, "prompt", "empty"),
        (completion(logprobs=21), 400, "logprobs", "less than or equal to 20"),
        (completion(logprobs=-1), 400, "logprobs", "greater than or equal to 0"),
        (completion(prompt=[[1, 2], [3, 320]], echo=True), 400, "prompt", "outside [0, 320)"),
        (chat(logprobs=True, top_logprobs=2), 400, "top_logprobs", "not alternatives"),
        (("/tokenize", {"add_special_tokens": False}), 400, "prompt", "Field required"),
        (("/tokenize", {"prompt": "x", "model": "gpt-4"}), 404, "model", "does not exist"),
        (("/detokenize", {"tokens": [1, 320]}), 400, "tokens", "token id 320 is outside [0, 320)"),
        (("/detokenize", {"tokens": "abc"}), 400, "tokens", "valid list"),
        (completion(stop=[str(i) for i in range(17)]), 400, "stop", "at most 16 items"),
        (completion(prompt={"text": "x"}), 400, "prompt", "valid string"),
        (chat(messages=[]), 400, "messages", "at least 1"),
        (chat(messages=[{"role": "robot", "content": "x"}]), 400, "messages.0.role", "'user'"),
        (chat(max_tokens=0), 400, "max_tokens", TOO_SMALL),
        (chat(truncate="newest"), 400, "truncate", "'oldest'"),
        (chat(truncate="oldest", max_tokens=CONTEXT), 400, "max_tokens", "leaves no room"),
        (
            chat(messages=[{"role": "user", "content": "word " * 400}], truncate="oldest"),
            400,
            "messages",
            "send a shorter message",
        ),
        (("/v1/nothing", {}), 404, None, "Not Found"),
    ],
)
def test_bad_requests_get_openai_errors(base_url, request_, status, param, message):
    response = post(base_url, *request_)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert message in error["message"]
    assert error["param"] == param
    assert error["type"] in ("invalid_request_error", "not_found_error")


def test_a_prompt_longer_than_the_context_is_refused_with_its_length(client, tokenizer):
    prompt = "word " * 400
    n = len(ChatTemplate(tokenizer).prompt_ids([Message("user", prompt)]))
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])
    message = error.value.body["message"]
    assert error.value.code == "context_length_exceeded"
    assert f"{n} tokens in the messages leave no room" in message
    assert f"the context window holds {CONTEXT} tokens" in message
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")


def test_a_chat_too_long_for_the_context_is_truncated_only_when_asked(base_url, engine, tokenizer):
    turns = [{"role": "system", "content": "Be brief."}]
    for i in range(6):
        turns.append({"role": ("user", "assistant")[i % 2], "content": f"{i}: " + "word " * 3})
    messages = [*turns, {"role": "user", "content": "And now?"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 32, "temperature": 0}
    refused = post(base_url, "/v1/chat/completions", body)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert "x-lmforge-dropped-messages" not in refused.headers

    template = ChatTemplate(tokenizer)
    ids, dropped = template.fit([Message(**m) for m in messages], CONTEXT - 32)
    assert 0 < dropped < len(messages) - 2  # some old turns go, the system message stays
    expected = direct(engine, ids, max_tokens=32, stop=template.stop, stop_ids=template.stop_ids)
    text = expected.text.removeprefix(template.reply_prefix)
    body["truncate"] = "oldest"
    reply = post(base_url, "/v1/chat/completions", body)
    assert reply.status_code == 200
    assert reply.headers["x-lmforge-dropped-messages"] == str(dropped)
    assert reply.json()["choices"][0]["message"]["content"] == text
    assert reply.json()["usage"]["prompt_tokens"] == len(ids)
    streamed = post(base_url, "/v1/chat/completions", {**body, "stream": True})
    assert streamed.headers["x-lmforge-dropped-messages"] == str(dropped)
    chunks = [json.loads(x[6:]) for x in streamed.text.splitlines() if x.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == text


@pytest.fixture(scope="module")
def slow(tokenizer):
    """One batch slot and a model that takes 20 ms per forward, so a stream outlives a read."""
    model = tiny_model(tokenizer.vocab_size)
    model.register_forward_hook(lambda *_: time.sleep(0.02))
    with Engine(model, tokenizer, max_batch_size=1) as engine:
        handles = []
        submit = engine.submit

        def recording_submit(ids, params):
            handles.append(submit(ids, params))
            return handles[-1]

        engine.submit = recording_submit
        with running(create_app(engine, tokenizer, MODEL)) as url:
            yield engine, url, handles


def wait_for(condition, seconds=20):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_client_that_disconnects_mid_stream_frees_its_slot(slow):
    engine, url, handles = slow
    body = {"model": MODEL, "prompt": "x", "max_tokens": 120, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # one token in
        assert engine.busy_slots == 1
    result = handles[-1].result()  # the client is gone: the request ends early
    assert result.finish_reason == "abort" and len(result.token_ids) < 120
    assert wait_for(lambda: engine.busy_slots == 0 and engine.reserved_kv_tokens == 0)


def test_a_client_that_gives_up_on_a_whole_reply_frees_its_slot(slow):
    engine, url, handles = slow
    body = {"model": MODEL, "prompt": "x", "max_tokens": 120, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
    result = handles[-1].result()
    assert result.finish_reason == "abort" and len(result.token_ids) < 120
    assert wait_for(lambda: engine.busy_slots == 0 and engine.reserved_kv_tokens == 0)


def test_a_queued_stream_whose_client_leaves_is_dropped_before_it_starts(slow):
    engine, url, handles = slow
    body = {"model": MODEL, "max_tokens": 100, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as http:
        first = http.build_request("POST", f"{url}/v1/completions", json={**body, "prompt": "a"})
        running_stream = http.send(first, stream=True)  # holds the only slot
        assert wait_for(lambda: engine.busy_slots == 1)
        second = {**body, "messages": [USER]}
        with http.stream("POST", f"{url}/v1/chat/completions", json=second) as response:
            assert response.status_code == 200  # headers go out before the first token
        result = handles[-1].result()  # left while queued: aborted without a token
        assert result.finish_reason == "abort" and result.token_ids == []
        assert engine.busy_slots == 1  # the first one goes on
        running_stream.close()
    assert wait_for(lambda: engine.busy_slots == 0 and engine.reserved_kv_tokens == 0)


def test_64_concurrent_requests_all_complete(base_url, engine, tokenizer):
    prompts = [f"x{i} = [{i}, " for i in range(64)]
    expected = engine.generate(
        [prompt_ids(tokenizer, p) for p in prompts], SamplingParams(max_tokens=8, temperature=0)
    )

    async def one(http, i):
        body = {"model": MODEL, "prompt": prompts[i], "max_tokens": 8, "temperature": 0}
        if i % 2:  # half of them stream
            text = ""
            async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        text += json.loads(line[6:])["choices"][0]["text"]
            return text, None
        reply = (await http.post("/v1/completions", json=body)).json()
        return reply["choices"][0]["text"], reply["usage"]["completion_tokens"]

    async def all_of_them():
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
            return await asyncio.wait_for(asyncio.gather(*(one(http, i) for i in range(64))), 120)

    results = asyncio.run(all_of_them())
    assert [text for text, _ in results] == [e.text for e in expected]
    for (_, tokens), e in zip(results[::2], expected[::2], strict=True):
        assert tokens == len(e.token_ids)
    assert engine.busy_slots == 0


def test_the_chat_page_and_its_assets_are_served(base_url):
    page = httpx.get(base_url, timeout=10)
    assert page.status_code == 200 and "/static/app.js" in page.text
    script = httpx.get(f"{base_url}/static/app.js", timeout=10)
    assert script.status_code == 200 and "/v1/chat/completions" in script.text


def test_serve_command_loads_a_checkpoint_and_binds_loopback(prepared, tmp_path, monkeypatch):
    import uvicorn

    from lmforge.cli import main
    from lmforge.train.checkpoint import save_checkpoint

    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    model = tiny_model(tokenizer.vocab_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints", 1, model, optimizer, {}, {}, {}, prepared.tokenizer_dir)
    seen = {}

    def run_here(app, host, port, **_):  # uvicorn.run, but on a free port and only this long
        seen.update(host=host, port=port)
        with running(app) as url:
            seen["models"] = httpx.get(f"{url}/v1/models", timeout=10).json()
            body = {"model": "run", "prompt": "x", "max_tokens": 4, "temperature": 0}
            seen["reply"] = httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()

    monkeypatch.setattr(uvicorn, "run", run_here)
    assert main(["serve", "--checkpoint", str(run)]) == 0
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 8000)
    assert seen["models"]["data"][0]["id"] == "run"
    assert seen["reply"]["usage"]["prompt_tokens"] == 2


def test_serve_on_a_taken_port_says_so_before_loading_the_model(monkeypatch, capsys):
    import socket

    import lmforge.infer.server as server
    from lmforge.cli import main

    monkeypatch.setattr(server, "load_for_decode", lambda *_: pytest.fail("loaded the model"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--checkpoint", "no-such-run", "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no banner
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err
    assert len(err.strip().splitlines()) == 1


def test_serve_without_the_serve_extra_names_what_is_missing(monkeypatch, capsys):
    import sys

    from lmforge.cli import main

    for name in ("fastapi", "anyio", "starlette"):  # as when fastapi was never installed
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "lmforge.infer.server")
    assert main(["serve", "--checkpoint", "no-such-run"]) == 2
    err = capsys.readouterr().err
    assert "lmforge serve needs fastapi" in err and "pip install 'lmforge[serve]'" in err


def test_a_completion_without_max_tokens_gets_16_as_from_openai(client, engine, tokenizer):
    reply = client.completions.create(model=MODEL, prompt="def main(", temperature=0)
    expected = direct(engine, prompt_ids(tokenizer, "def main("), max_tokens=16)
    assert expected.finish_reason == "length"
    assert reply.choices[0].text == expected.text
    assert reply.usage.completion_tokens == len(expected.token_ids)


class BrokenEngine:
    """An engine whose every request fails once generation starts."""

    max_context = CONTEXT
    queued_requests = 0

    def submit(self, ids, params):
        return BrokenRequest()


class BrokenRequest:
    async def __aiter__(self):
        raise RuntimeError("out of memory")
        yield

    def cancel(self):
        pass


def test_a_failing_engine_gives_a_server_error_not_a_hang(tokenizer):
    from fastapi.testclient import TestClient

    http = TestClient(create_app(BrokenEngine(), tokenizer, MODEL), raise_server_exceptions=False)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4}
    reply = http.post("/v1/completions", json=body)
    assert reply.status_code == 500
    assert reply.json()["error"]["type"] == "server_error"
    assert "out of memory" in reply.json()["error"]["message"]
    streamed = http.post("/v1/completions", json={**body, "stream": True}).text
    events = [line[6:] for line in streamed.splitlines() if line.startswith("data: ")]
    assert "out of memory" in json.loads(events[0])["error"]["message"]
    assert events[-1] == "[DONE]"


# -- echo, top logprobs, the tokenizer routes, lm-eval's local-completions -----------------------


def completions(base_url, **fields):
    reply = post(base_url, "/v1/completions", {"model": MODEL, "temperature": 0, **fields})
    assert reply.status_code == 200, reply.text
    return reply.json()


def token_text(tokenizer, token):
    return tokenizer.token_bytes(token).decode("utf-8", errors="replace")


def top_dict(tokenizer, top):
    """What the server sends for score()'s alternatives: {text: logprob}, the likelier of two
    ids with one text."""
    out = {}
    for token, logprob in top:
        out.setdefault(token_text(tokenizer, token), logprob)
    return out


def assert_top_equal(got, want):
    assert list(got) == list(want)
    assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-5)


def test_echo_logprobs_of_token_prompts_equal_score(base_url, tokenizer):
    """lm-eval's log-likelihood request: echo + logprobs 1 + max_tokens 1 on token-id prompts."""
    prompts = [prompt_ids(tokenizer, "def main("), tokenizer.encode_ordinary("x = [1, 2]")]
    reply = completions(base_url, prompt=prompts, echo=True, logprobs=1, max_tokens=1)
    model = tiny_model(tokenizer.vocab_size)  # the served weights (same seed)
    expected = score(model, [(ids[:1], ids[1:]) for ids in prompts], top_n=1)
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    for choice, ids, want in zip(reply["choices"], prompts, expected, strict=True):
        logprobs, n = choice["logprobs"], len(ids)
        assert logprobs["tokens"][:n] == [token_text(tokenizer, t) for t in ids]
        assert len(logprobs["tokens"]) == n + 1  # the prompt, then the one generated token
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        assert logprobs["token_logprobs"][1:n] == pytest.approx(want.logprobs, abs=1e-5)
        for got, top in zip(logprobs["top_logprobs"][1:n], want.top, strict=True):
            assert_top_equal(got, top_dict(tokenizer, top))
        generated = logprobs["top_logprobs"][n]  # greedy: the chosen token is the top one
        assert list(generated) == [logprobs["tokens"][n]]
        assert logprobs["token_logprobs"][n] == pytest.approx(max(generated.values()), abs=1e-6)
        assert choice["text"] == tokenizer.decode(ids) + logprobs["tokens"][n]
        offsets = logprobs["text_offset"]
        assert offsets[0] == 0 and offsets == sorted(offsets)
    assert reply["usage"]["prompt_tokens"] == sum(map(len, prompts))
    assert reply["usage"]["completion_tokens"] == 2


def test_five_alternatives_for_prompt_and_generated_tokens(base_url, engine, tokenizer):
    reply = completions(base_url, prompt="for i in", echo=True, logprobs=5, max_tokens=4)
    (choice,) = reply["choices"]
    ids = prompt_ids(tokenizer, "for i in")
    logprobs = choice["logprobs"]
    everything = ids + direct(engine, ids, max_tokens=4).token_ids
    assert logprobs["tokens"] == [token_text(tokenizer, t) for t in everything]
    model = tiny_model(tokenizer.vocab_size)
    (want,) = score(model, [(everything[:1], everything[1:])], top_n=5)
    tops = logprobs["top_logprobs"][1:]
    assert len(tops) == len(want.top) == len(ids) - 1 + 4
    for got, top in zip(tops, want.top, strict=True):
        assert_top_equal(got, top_dict(tokenizer, top))
        assert list(got.values()) == sorted(got.values(), reverse=True)
    assert any(len(top) == 5 for top in tops)  # fewer only where two ids share a text
    plain = completions(base_url, prompt="for i in", logprobs=5, max_tokens=4)["choices"][0]
    assert plain["text"] == choice["text"][len("for i in") :]  # without echo: generated only
    assert plain["logprobs"]["tokens"] == logprobs["tokens"][len(ids) :]
    for got, echoed in zip(plain["logprobs"]["top_logprobs"], tops[len(ids) - 1 :], strict=True):
        assert_top_equal(got, echoed)
    chosen_only = completions(base_url, prompt="for i in", logprobs=0, echo=True, max_tokens=2)
    assert chosen_only["choices"][0]["logprobs"]["top_logprobs"] is None


def test_max_tokens_0_with_echo_scores_the_prompt_alone(base_url, tokenizer):
    ids = prompt_ids(tokenizer, "while True:")
    reply = completions(base_url, prompt=ids, echo=True, logprobs=2, max_tokens=0, n=2)
    (want,) = score(tiny_model(tokenizer.vocab_size), [(ids[:1], ids[1:])], top_n=2)
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    for choice in reply["choices"]:
        assert choice["text"] == tokenizer.decode(ids)
        assert choice["finish_reason"] == "length"
        assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(want.logprobs, abs=1e-5)
        assert len(choice["logprobs"]["tokens"]) == len(ids)
    assert reply["usage"]["completion_tokens"] == 0
    assert reply["usage"]["prompt_tokens"] == len(ids)  # per prompt, not per choice
    full = [tokenizer.eot_id] * CONTEXT  # a whole context window fits when nothing is generated
    assert len(completions(base_url, prompt=full, echo=True, max_tokens=0)["choices"]) == 1
    text = completions(base_url, prompt="a b", echo=True, max_tokens=0)["choices"][0]["text"]
    assert text == "a b"  # a text prompt echoes as sent, without the document start


def test_echo_streams_the_prompt_first(base_url, tokenizer):
    body = {"prompt": "import os\n", "echo": True, "logprobs": 3, "max_tokens": 6}
    whole = completions(base_url, **body)["choices"][0]
    streamed = post(
        base_url, "/v1/completions", {**body, "model": MODEL, "temperature": 0, "stream": True}
    )
    chunks = [json.loads(x[6:]) for x in streamed.text.splitlines() if x.startswith("data: {")]
    pieces = [c["choices"][0] for c in chunks]
    assert pieces[0]["text"] == "import os\n"
    assert "".join(p["text"] for p in pieces) == whole["text"]
    assert pieces[-1]["finish_reason"] == whole["finish_reason"]
    tokens = [t for p in pieces if p["logprobs"] for t in p["logprobs"]["tokens"]]
    assert tokens == whole["logprobs"]["tokens"]
    echoed = pieces[0]["logprobs"]  # the prompt's tokens, then the generated ones after them
    assert echoed["text_offset"] == whole["logprobs"]["text_offset"][: len(echoed["tokens"])]
    assert pieces[1]["logprobs"]["text_offset"][0] >= echoed["text_offset"][-1]
    only = post(
        base_url, "/v1/completions", {**body, "model": MODEL, "max_tokens": 0, "stream": True}
    ).text
    events = [line[6:] for line in only.splitlines() if line.startswith("data: ")]
    assert [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]] == [None, "length"]
    assert events[-1] == "[DONE]"


def test_tokenizer_routes_round_trip(base_url, tokenizer):
    info = httpx.get(f"{base_url}/tokenizer_info", timeout=10).json()
    assert info["eos_token"] == info["bos_token"] == "<|endoftext|>"
    assert info["model_max_length"] == CONTEXT and "pad_token" in info
    text = "<|endoftext|>def main():\n    return 1"
    plain = post(base_url, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    assert plain["tokens"] == [tokenizer.eot_id, *tokenizer.encode_ordinary(text[13:])]
    assert plain["count"] == len(plain["tokens"]) and plain["max_model_len"] == CONTEXT
    started = post(base_url, "/tokenize", {"prompt": "def", "model": MODEL}).json()["tokens"]
    assert started == prompt_ids(tokenizer, "def")  # a document start
    body = {"prompt": "def", "add_special_tokens": False}  # as lm-eval's remote tokenizer asks
    assert post(base_url, "/tokenize", body).json()["tokens"] == started
    back = post(base_url, "/detokenize", {"tokens": plain["tokens"]}).json()
    assert back == {"prompt": text}


def test_lm_eval_local_completions_against_the_server(base_url, engine, tokenizer):
    pytest.importorskip("lm_eval")  # an import guard: lm-eval is a dev dependency
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    lm = LocalCompletionsAPI(
        base_url=f"{base_url}/v1/completions",
        model=MODEL,
        tokenizer_backend="remote",
        tokenized_requests=True,
        num_concurrent=1,
        max_retries=1,
        max_length=CONTEXT,
        max_gen_toks=8,
    )
    assert lm.eot_token_id == lm.prefix_token_id == tokenizer.eot_id
    pairs = [("def main(", ")"), ("x = 1 ", "+ 2\n"), ("<|endoftext|>import", " os")]
    greedy = direct(engine, prompt_ids(tokenizer, "x = 1"), max_tokens=2).text
    pairs.append(("x = 1", greedy))  # the tiny model's own greedy continuation
    requests = [
        Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=0) for pair in pairs
    ]
    got = lm.loglikelihood(requests, disable_tqdm=True)

    def encode(text):  # a document start first, as the server's /tokenize gives it
        return document_start(tokenizer, tokenizer.encode(text, allowed_special="all"))

    def encode_pair(context, continuation):  # lm-eval's _encode_pair for a causal model
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole, context_ids = encode(context + continuation), encode(context)
        return context_ids, whole[len(context_ids) :]

    expected = score(tiny_model(tokenizer.vocab_size), [encode_pair(*p) for p in pairs])
    for (loglikelihood, greedy), want in zip(got, expected, strict=True):
        assert loglikelihood == pytest.approx(want.total, abs=1e-4)
        assert greedy == want.is_greedy
    assert [greedy for _, greedy in got] == [False, False, False, True]

    until = {"until": ["\n"], "max_gen_toks": 8}
    generation = Instance(request_type="generate_until", doc={}, arguments=("x = [", until), idx=0)
    (text,) = lm.generate_until([generation], disable_tqdm=True)
    assert text == direct(engine, encode("x = ["), max_tokens=8, stop=("\n",)).text


def test_chat_turns_report_the_prompt_tokens_the_prefix_cache_held(client):
    system = {"role": "system", "content": "You answer in one word, politely. "}
    messages = [system, {"role": "user", "content": "Name a colour."}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0
    )
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And another?"},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The first turn's prompt (its full blocks of 16) came from the cache, not the new message.
    assert first.usage.prompt_tokens - 16 < cached < second.usage.prompt_tokens
    assert cached % 16 == 0


def test_a_cancelled_call_of_several_choices_stops_waiting_for_their_events():
    """A client that hangs up cancels its call's requests and the tasks reading their events
    (`_Job.cancel`); the call's own loop over the merged events must end then too. It once
    waited forever for tasks that were cancelled before they said they were done, so the
    handler outlived its client."""
    from lmforge.infer.output import RequestHandle
    from lmforge.infer.server import _Choice, _Job

    async def call() -> None:
        silent = [RequestHandle(lambda handle: None) for _ in range(2)]  # no event ever comes
        job = _Job([_Choice(i, handle, stripper=None) for i, handle in enumerate(silent)], 1)
        merged = asyncio.create_task(anext(job.events(), None))
        await asyncio.sleep(0.05)  # the readers are waiting on their requests
        job.cancel()
        assert await asyncio.wait_for(merged, timeout=5) is None

    asyncio.run(call())
