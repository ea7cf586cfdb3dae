"""Schema fuzzing: schemathesis generates requests from the server's own OpenAPI schema (valid
ones and ones that break it) and sends them in process, through the ASGI app, to a tiny random
model. No request may get a 5xx or crash the server, and every refusal has OpenAI's error
shape."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings

schemathesis = pytest.importorskip("schemathesis")  # a dev dependency: this runs in make test

from lmforge.infer.engine import Engine  # noqa: E402
from lmforge.infer.server import create_app  # noqa: E402
from lmforge.infer.server_limits import ServerLimits  # noqa: E402
from lmforge.model import ModelConfig, Transformer  # noqa: E402
from lmforge.tokenizer import Tokenizer  # noqa: E402

MODEL = "tiny"
EXAMPLES = 60  # per mode, over 7 operations


@pytest.fixture(scope="module")
def engine(prepared):
    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1, n_heads=2, max_seq_len=64
    )
    with Engine(Transformer(config).eval(), tokenizer, max_batch_size=4) as engine:
        yield engine, tokenizer


@pytest.fixture(scope="module")
def api_schema(engine):
    engine, tokenizer = engine
    # a small reply cap keeps each generated request short; larger ones get a 400
    app = create_app(engine, tokenizer, MODEL, ServerLimits(max_tokens=8, max_body_bytes=2**16))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_request_gets_a_server_error(api_schema, mode):
    """Requests that fit the schema, then requests that break it, across every operation."""
    from schemathesis.generation.modes import GenerationMode

    operations = {
        f"{op.ok().method.upper()} {op.ok().path}" for op in api_schema.get_all_operations()
    }
    assert {"POST /v1/completions", "POST /v1/chat/completions", "POST /tokenize"} <= operations
    seen, statuses = set(), set()

    @given(case=api_schema.as_strategy(GenerationMode(mode)))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case):
        seen.add(f"{case.method.upper()} {case.operation.path}")
        response = case.call()
        statuses.add(response.status_code)
        assert response.status_code < 500, (case.method, case.path, case.body, response.text)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["message"]

    check()
    assert len(seen) >= 4  # the examples spread over the operations
    assert 400 in statuses and (mode == "negative" or 200 in statuses), statuses


def test_the_engine_is_idle_after_the_fuzzing(engine):
    import time

    engine, _ = engine
    deadline = time.monotonic() + 20
    while engine.busy_slots and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.busy_slots == engine.queued_requests == engine.reserved_kv_tokens == 0
