"""The pictures in the docs, taken from a real run: the report's loss curve, the top of
report.md, and the web chat page of `lmforge serve`, into docs/images/.

    python docs/gen/screenshots.py [--run RUN_DIR]

It trains a small speedrun first (about two minutes on two cores), into a temporary folder or
into --run when that holds no run yet. The chat page's request gets a fixed sampling seed, so
the same run gets the same reply. The browser is Debian's Chromium (/usr/bin/chromium, which
`make test` installs), driven by playwright as the chat page's test drives it; nothing is
downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "images"
BIN = Path(sys.executable).parent
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
SPEEDRUN = [
    "speedrun", "--preset", "tiny",
    "--set", "train.max_steps=300", "--set", "train.eval.every=50",
    "--set", "model.max_seq_len=256", "--set", "train.seq_len=128",  # room for a chat turn
]  # fmt: skip
PROMPT = "def fibonacci(n):"
NAME = ["--model-name", "speedrun-tiny"]  # what the page header shows
REPORT_CSS = """
body { font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       max-width: 860px; margin: 24px auto; color: #222; }
h1 { font-size: 26px; } h2 { font-size: 20px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
code, pre { font-family: "DejaVu Sans Mono", monospace; font-size: 13px; background: #f5f5f5; }
img { max-width: 100%; }
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run", help="a run folder to picture (trained first where it holds no run yet)"
    )
    args = parser.parse_args()
    IMAGES.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LMFORGE_PROGRESS": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.run) if args.run else Path(tmp) / "run"
        if not (run / "report.md").exists():
            subprocess.run(
                [str(BIN / "lmforge"), *SPEEDRUN, "--out", str(run)], env=env, check=True
            )
        shutil.copyfile(run / "plots" / "loss.png", IMAGES / "loss.png")
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=FLAGS
            )
            try:
                report_screenshot(browser, run, IMAGES / "report.png")
                chat_screenshot(browser, run, env, IMAGES / "chat.png")
            finally:
                browser.close()
    for name in ("loss.png", "report.png", "chat.png"):
        print(f"wrote {(IMAGES / name).relative_to(ROOT)}")
    return 0


def report_screenshot(browser, run: Path, out: Path) -> None:
    """The top of report.md, rendered as a Markdown viewer would (tables, code)."""
    import markdown

    body = markdown.markdown((run / "report.md").read_text(), extensions=["tables", "fenced_code"])
    html = run / "report.html"
    html.write_text(f"<!doctype html><meta charset=utf-8><style>{REPORT_CSS}</style>{body}")
    page = browser.new_page(viewport={"width": 920, "height": 900}, device_scale_factor=1)
    page.goto(html.as_uri())
    page.screenshot(path=str(out))
    page.close()


def chat_screenshot(browser, run: Path, env: dict, out: Path) -> None:
    """The chat page of `lmforge serve` on the run's checkpoint, after one streamed reply."""
    port = _free_port()
    server = subprocess.Popen(
        [str(BIN / "lmforge"), "serve", "--checkpoint", str(run), "--port", str(port), *NAME],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_for(url + "v1/models", server)
        page = browser.new_page(viewport={"width": 900, "height": 640}, device_scale_factor=1)
        page.goto(url)
        page.wait_for_selector("#send:not([disabled])")
        page.route("**/v1/chat/completions", _seeded)  # the same reply, so the same picture
        page.fill("#temperature", "0.7")
        page.fill("#max-tokens", "64")
        page.fill("#input", PROMPT)
        page.press("#input", "Enter")
        done = ".message.assistant[data-done='true'], .message.error"
        page.wait_for_selector(done, state="attached", timeout=120_000)
        if page.locator(".message.error").count():
            raise SystemExit(f"the chat page says: {page.inner_text('.message.error')}")
        page.screenshot(path=str(out))
        page.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def _seeded(route) -> None:
    """The page's request with a fixed sampling seed added (the page itself sends none)."""
    body = json.loads(route.request.post_data or "{}")
    route.continue_(post_data=json.dumps({**body, "seed": 0}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"lmforge serve exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"lmforge serve did not answer {url} in {timeout:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
