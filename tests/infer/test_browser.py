"""The web chat page in real headless Chromium (Debian's /usr/bin/chromium, driven by playwright):
type a message, send it, watch the reply stream in and compare it with the engine's own."""

import os
import time

import pytest
import torch
from playwright.sync_api import sync_playwright

from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.server import create_app, running
from lmforge.model import ModelConfig, Transformer
from lmforge.tokenizer import Tokenizer
from lmforge.tokenizer.chat_template import ChatTemplate, Message

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Counts the reply's text changes, to tell a streamed reply from one that arrives whole.
WATCH_REPLY = """() => {
  window.replyUpdates = 0;
  new MutationObserver(() => { window.replyUpdates += 1; }).observe(
    document.getElementById("messages"), { subtree: true, childList: true, characterData: true });
}"""


@pytest.fixture(scope="module")
def served(prepared):
    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, d_model=32, n_layers=2, n_heads=2, max_seq_len=128
    )
    model = Transformer(config)
    model.register_forward_hook(lambda *_: time.sleep(0.01))  # tokens arrive one by one
    engine = Engine(model, tokenizer, max_batch_size=2)
    with engine, running(create_app(engine, tokenizer, "tiny")) as url:
        yield engine, tokenizer, url


@pytest.fixture
def page(tmp_path):
    assert os.access(CHROMIUM, os.X_OK), "install Debian's chromium (make test does)"
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            tmp_path / "profile", executable_path=CHROMIUM, headless=True, args=FLAGS
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def send(page, text, max_tokens):
    """Type `text` with `max_tokens` set; wait for its reply (the nth assistant message)."""
    n = page.locator(".message.assistant").count()
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#input", text)
    page.press("#input", "Enter")
    done = ".message.assistant[data-done='true'], .message.error"
    page.wait_for_selector(f"{done} >> nth={n}", timeout=30_000)
    return page.locator(done).nth(n)


def test_a_typed_message_gets_a_streamed_greedy_reply(served, page, tmp_path):
    engine, tokenizer, url = served
    page.goto(url)
    page.wait_for_selector("#send:not([disabled])")
    assert "tiny" in page.inner_text("#model")
    page.fill("#temperature", "0")
    page.evaluate(WATCH_REPLY)
    reply = send(page, "Hello there", 24)

    template = ChatTemplate(tokenizer)

    def greedy(ids, max_tokens):
        stops = dict(stop=template.stop, stop_ids=template.stop_ids)
        params = SamplingParams(max_tokens=max_tokens, temperature=0, **stops)
        result = engine.generate([ids], params)[0]
        return result.text.removeprefix(template.reply_prefix), result.finish_reason

    conversation = [Message("user", "Hello there")]
    text, finish = greedy(template.prompt_ids(conversation), 24)
    assert reply.text_content() == text
    assert reply.get_attribute("data-finish") == finish
    assert page.inner_text(".message.user") == "Hello there"
    assert page.evaluate("window.replyUpdates") > 3  # pieces, not one block
    assert page.locator(".message.note").count() == 0

    # A second turn whose max tokens leave no room for the whole conversation: the server
    # leaves out the oldest message, as `lmforge chat` does, and the page says so.
    conversation += [Message("assistant", text), Message("user", "Tell me more")]
    max_tokens = engine.max_context - len(template.prompt_ids(conversation)) + 1
    ids, dropped = template.fit(conversation, engine.max_context - max_tokens)
    second = send(page, "Tell me more", max_tokens)
    assert page.locator(".message.error").count() == 0
    assert second.text_content() == greedy(ids, max_tokens)[0]
    note = page.locator(".message.note")
    assert note.count() == 1 and note.text_content().startswith(f"{dropped} earliest message")
    page.screenshot(path=tmp_path / "chat.png")


def test_with_an_api_key_the_page_asks_for_it_and_chats(served, page):
    from lmforge.infer.server_limits import ServerLimits

    engine, tokenizer, _ = served
    asked = []

    def answer(dialog):
        asked.append(dialog.message)
        dialog.accept("sesame")

    page.on("dialog", answer)
    app = create_app(engine, tokenizer, "tiny", ServerLimits(api_key="sesame"))
    with running(app) as url:
        page.goto(url)  # the page itself needs no key
        page.wait_for_selector("#send:not([disabled])")
        assert "tiny" in page.inner_text("#model")
        reply = send(page, "Hello there", 4)
        assert page.locator(".message.error").count() == 0
        assert reply.get_attribute("data-finish") in ("length", "stop")
    assert len(asked) == 1 and "API key" in asked[0]  # asked once, then kept
