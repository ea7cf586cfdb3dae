"""The server's guards live on loopback: the API key, body size, prompt and reply caps, the
bounded queue (lmforge.infer.server_limits), and a shutdown that drains."""

import threading
import time

import httpx
import openai
import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.server import create_app, running
from lmforge.infer.server_limits import ServerLimits, exposure_warning, is_loopback
from lmforge.model import ModelConfig, Transformer
from lmforge.tokenizer import Tokenizer

MODEL = "tiny"
KEY = "sesame-0123456789"


def tiny_model(vocab_size: int) -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=vocab_size, d_model=32, n_layers=2, n_heads=2, max_seq_len=128)
    return Transformer(config).eval()


def wait_for(condition, seconds=20):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


@pytest.fixture(scope="module")
def tokenizer(prepared):
    return Tokenizer.load(prepared.tokenizer_dir)


@pytest.fixture(scope="module")
def engine(tokenizer):
    with Engine(tiny_model(tokenizer.vocab_size), tokenizer, max_batch_size=4) as engine:
        yield engine


@pytest.fixture(scope="module")
def guarded(engine, tokenizer):
    limits = ServerLimits(api_key=KEY, max_body_bytes=4000, max_prompt_tokens=40, max_tokens=8)
    with running(create_app(engine, tokenizer, MODEL, limits)) as url:
        yield url


def auth(key=KEY):
    return {"Authorization": f"Bearer {key}"}


def assert_openai_error(reply, status, code=None, param=None):
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["param"] == param
    assert error["message"] and "\n" not in error["message"]
    return error


@pytest.mark.parametrize(
    "headers", [{}, auth("wrong"), {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}]
)
def test_v1_routes_want_the_api_key(guarded, headers):
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions")]:
        reply = httpx.request(method, f"{guarded}{path}", headers=headers, json={}, timeout=10)
        error = assert_openai_error(reply, 401, "invalid_api_key")
        assert "Authorization: Bearer" in error["message"]
        assert reply.headers["www-authenticate"] == "Bearer"


def test_with_the_key_the_official_client_works_and_the_page_needs_none(guarded):
    client = openai.OpenAI(base_url=f"{guarded}/v1", api_key=KEY, timeout=30, max_retries=0)
    reply = client.completions.create(model=MODEL, prompt="x", max_tokens=3, temperature=0)
    assert reply.usage.completion_tokens == 3
    assert httpx.get(f"{guarded}/", timeout=10).status_code == 200
    assert httpx.get(f"{guarded}/static/app.js", timeout=10).status_code == 200
    assert httpx.get(f"{guarded}/tokenizer_info", timeout=10).status_code == 200  # as vLLM
    bad = openai.OpenAI(base_url=f"{guarded}/v1", api_key="nope", timeout=30, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_a_body_over_the_limit_gets_413_declared_or_chunked(guarded):
    body = {"model": MODEL, "prompt": "x" * 5000, "max_tokens": 1}
    reply = httpx.post(f"{guarded}/v1/completions", json=body, headers=auth(), timeout=10)
    assert "4000 bytes" in assert_openai_error(reply, 413, "request_too_large")["message"]

    def chunks():  # no content-length: the guard counts what arrives
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}'

    url = f"{guarded}/v1/completions"
    reply = httpx.post(url, content=chunks(), headers=auth(), timeout=10)
    assert_openai_error(reply, 413, "request_too_large")


def test_prompt_and_max_tokens_caps_get_400(guarded, tokenizer):
    url = f"{guarded}/v1/completions"
    long_prompt = list(range(1, 50))  # token ids: 49 > 40
    body = {"model": MODEL, "prompt": long_prompt, "max_tokens": 1}
    reply = httpx.post(url, json=body, headers=auth(), timeout=10)
    error = assert_openai_error(reply, 400, "context_length_exceeded", "prompt")
    assert "--max-prompt-tokens" in error["message"] and "49" in error["message"]
    body = {"model": MODEL, "prompt": "x", "max_tokens": 9}
    reply = httpx.post(url, json=body, headers=auth(), timeout=10)
    assert "--max-tokens" in assert_openai_error(reply, 400, None, "max_tokens")["message"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    reply = httpx.post(f"{guarded}/v1/chat/completions", json=chat, headers=auth(), timeout=30)
    assert reply.status_code == 200
    assert reply.json()["usage"]["completion_tokens"] <= 8  # no max_tokens: the server's cap


@pytest.fixture
def slow(tokenizer):
    """One batch slot and 20 ms a forward pass, so requests wait and last."""
    model = tiny_model(tokenizer.vocab_size)
    model.register_forward_hook(lambda *_: time.sleep(0.02))
    with Engine(model, tokenizer, max_batch_size=1) as engine:
        yield engine


def test_a_full_queue_gets_429_with_retry_after(slow, tokenizer):
    app = create_app(slow, tokenizer, MODEL, ServerLimits(max_queue=2, retry_after_s=3))
    body = {"model": MODEL, "prompt": "x", "max_tokens": 100, "temperature": 0, "stream": True}
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        streams = []
        for expected_queue in (0, 1, 2):  # one runs, two wait
            streams.append(
                http.send(http.build_request("POST", "/v1/completions", json=body), stream=True)
            )
            assert streams[-1].status_code == 200
            assert wait_for(lambda n=expected_queue: slow.queued_requests == n)
        refused = http.post("/v1/completions", json={**body, "stream": False})
        assert (
            "--max-queue 2" in assert_openai_error(refused, 429, "rate_limit_exceeded")["message"]
        )
        assert refused.json()["error"]["type"] == "requests"
        assert refused.headers["retry-after"] == "3"
        assert http.get("/v1/models").status_code == 200  # only generation is bounded
        for stream in streams:
            stream.close()
    assert wait_for(lambda: slow.busy_slots == slow.queued_requests == slow.reserved_kv_tokens == 0)


def test_shutdown_lets_a_request_in_flight_finish(slow, tokenizer):
    app = create_app(slow, tokenizer, MODEL)
    replies = []
    body = {"model": MODEL, "prompt": "x", "max_tokens": 40, "temperature": 0}
    with running(app, shutdown_timeout=20) as url:

        def ask():
            replies.append(httpx.post(f"{url}/v1/completions", json=body, timeout=30))

        client = threading.Thread(target=ask)
        client.start()
        assert wait_for(lambda: slow.busy_slots == 1)
    # the block's end stopped the server: only after the reply went out whole
    client.join(30)
    (reply,) = replies
    assert reply.status_code == 200
    assert reply.json()["usage"]["completion_tokens"] == 40
    assert slow.busy_slots == 0 and slow.reserved_kv_tokens == 0
    slow.close()
    with pytest.raises(LmforgeError, match="the engine is closed"):
        slow.submit([1], SamplingParams(max_tokens=1))


def test_shutdown_past_its_timeout_aborts_and_frees_the_engine(slow, tokenizer):
    app = create_app(slow, tokenizer, MODEL)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 120, "temperature": 0}
    outcome = []
    with running(app, shutdown_timeout=0.2) as url:

        def ask():
            try:
                outcome.append(httpx.post(f"{url}/v1/completions", json=body, timeout=30))
            except httpx.HTTPError as e:
                outcome.append(e)

        client = threading.Thread(target=ask)
        client.start()
        assert wait_for(lambda: slow.busy_slots == 1)
    client.join(30)
    (cut,) = outcome  # 120 tokens take 2.4 s, the drain allowed 0.2 s: no whole reply
    assert isinstance(cut, httpx.HTTPError) or cut.status_code != 200, cut
    assert wait_for(lambda: slow.busy_slots == 0 and slow.reserved_kv_tokens == 0)


def test_binding_beyond_loopback_without_a_key_warns_in_one_line():
    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.org"))
    assert exposure_warning("127.0.0.1", ServerLimits()) is None
    assert exposure_warning("0.0.0.0", ServerLimits(api_key=KEY)) is None
    warning = exposure_warning("0.0.0.0", ServerLimits())
    assert warning.startswith("warning: serving on 0.0.0.0 without an API key")
    assert "--api-key" in warning and "\n" not in warning


def test_serve_warns_on_an_open_host_and_reads_the_key_from_the_environment(monkeypatch, capsys):
    import lmforge.infer.server as server
    from lmforge.cli import main

    monkeypatch.setattr(server, "check_port", lambda *_: None)  # nothing binds in this test
    seen = []

    def stop(*_):
        seen.append(True)
        raise LmforgeError("stop here")

    monkeypatch.setattr(server, "load_for_decode", stop)
    monkeypatch.delenv("LMFORGE_API_KEY", raising=False)
    assert main(["serve", "--checkpoint", "run", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("warning: serving on 0.0.0.0 without an API key")
    monkeypatch.setenv("LMFORGE_API_KEY", KEY)
    assert main(["serve", "--checkpoint", "run", "--host", "0.0.0.0"]) == 2
    assert "warning" not in capsys.readouterr().err
    assert ServerLimits.from_env().api_key == KEY
    assert ServerLimits.from_env("other").api_key == "other"
    assert main(["serve", "--checkpoint", "run", "--max-queue", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--max-queue -1 is invalid" in err and len(err.splitlines()) == 1
    assert len(seen) == 2
