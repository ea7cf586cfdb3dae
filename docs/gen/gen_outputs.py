"""What a page's commands printed on a real machine, shown under them: the blocks of
`docs/gen/page_outputs.json` (written by docs/gen/capture.py, `make docs-outputs`) rendered into
the `<!-- generated:output-K -->` blocks of the pages, K counting the page's runnable blocks
from 1. Each capture keeps a hash of its block's code, so a block edited after its output was
captured makes the generated docs stale until it is captured again."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
OUTPUTS = ROOT / "docs" / "gen" / "page_outputs.json"
MARKER = re.compile(r"<!-- generated:output-(\d+) -->")
SHOWN_LINES = 40  # a longer output shows its last lines

sys.path.insert(0, str(ROOT / "tests" / "docs"))
import runner  # noqa: E402


def marked_pages() -> list[Path]:
    """Pages that show a block's output."""
    return sorted(p for p in DOCS.rglob("*.md") if MARKER.search(p.read_text()))


def wanted(page: Path) -> dict[int, runner.Block]:
    """The runnable blocks whose output `page` shows, by their 1-based index."""
    runnable = [b for b in runner.parse(page.read_text()) if b.kind and b.skip is None]
    shown = {int(k) for k in MARKER.findall(page.read_text())}
    for k in shown:
        if not 1 <= k <= len(runnable):
            raise SystemExit(f"{rel(page)}: generated:output-{k} names no runnable block")
    return {k: runnable[k - 1] for k in sorted(shown)}


def code_hash(block: runner.Block) -> str:
    return hashlib.sha256(block.code.encode()).hexdigest()[:16]


def rel(page: Path) -> str:
    return page.relative_to(DOCS).as_posix()


def load() -> dict:
    return json.loads(OUTPUTS.read_text()) if OUTPUTS.exists() else {"pages": {}}


def blocks(page: Path, captured: dict) -> dict[str, str]:
    """The content of each `output-K` block of `page`: the captured output and the machine."""
    record = captured["pages"].get(rel(page), {})
    content = {}
    for k, block in wanted(page).items():
        got = record.get(str(k))
        if got is None or got["code"] != code_hash(block):
            why = "was never captured" if got is None else "changed after its output was captured"
            raise SystemExit(
                f"{rel(page)}: the block at line {block.line} {why}; run "
                f"`make docs-outputs PAGES=docs/{rel(page)}` on a quiet machine"
            )
        lines = got["output"].rstrip().splitlines()
        if len(lines) > SHOWN_LINES:
            lines = ["...", *lines[-SHOWN_LINES:]]
        fence = "````" if any(line.startswith("```") for line in lines) else "```"
        content[f"output-{k}"] = "\n".join(
            [
                f"{fence}text",
                *lines,
                fence,
                "",
                f"*Printed by the block above on {got['machine']}, {got['date']} (lmforge "
                f"{got['lmforge']}, torch {got['torch']}). Your machine prints its own.*",
            ]
        )
    return content
