"""The web chat page in real headless Chromium (Debian's /usr/bin/chromium, driven by playwright):
type a message, send it, watch the reply stream in and compare it with the engine's own."""

import os
import time

import pytest
import torch
from playwright.sync_api import sync_playwright

from lmforge.infer.chat_template import ChatTemplate, Message
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.server import create_app, running
from lmforge.model import ModelConfig, Transformer
from lmforge.tokenizer import Tokenizer

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


def test_a_typed_message_gets_a_streamed_greedy_reply(served, page, tmp_path):
    engine, tokenizer, url = served
    page.goto(url)
    page.wait_for_selector("#send:not([disabled])")
    assert "tiny" in page.inner_text("#model")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "24")
    page.evaluate(WATCH_REPLY)
    page.fill("#input", "Hello there")
    page.press("#input", "Enter")
    page.wait_for_selector(".message.assistant[data-done='true']", timeout=30_000)

    template = ChatTemplate(tokenizer)
    ids = template.prompt_ids([Message("user", "Hello there")])
    params = SamplingParams(
        max_tokens=24, temperature=0, stop=template.stop, stop_ids=template.stop_ids
    )
    expected = engine.generate([ids], params)[0]
    reply = page.locator(".message.assistant")
    assert reply.text_content() == expected.text.removeprefix(template.reply_prefix)
    assert reply.get_attribute("data-finish") == expected.finish_reason
    assert page.inner_text(".message.user") == "Hello there"
    assert page.evaluate("window.replyUpdates") > 3  # pieces, not one block
    page.screenshot(path=tmp_path / "chat.png")
