"""Write (or check) every generated part of the documentation.

    python docs/gen/generate.py           # write: what `make docs` runs before building
    python docs/gen/generate.py --check   # exit 1 naming every stale file (the docs test's check)

Whole pages: docs/reference/cli.md (the argparse parsers), docs/reference/config.md (the config
dataclasses), docs/benchmarks/*.md (benchmarks/results/*.json) and benchmarks/history.json.
Blocks inside hand-written pages, between `<!-- generated:NAME -->` and
`<!-- /generated:NAME -->`: the results table of README.md and docs/index.md, the layers of
docs/architecture.md (the import-linter contracts) and what a page's commands printed on a real
machine (docs/gen/page_outputs.json, written by docs/gen/capture.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import gen_bench  # noqa: E402
import gen_cli  # noqa: E402
import gen_config  # noqa: E402
import gen_layers  # noqa: E402
import gen_outputs  # noqa: E402

ROOT = HERE.parents[1]


def outputs(today: str | None = None) -> dict[str, str | bytes]:
    """Every generated file, by path relative to the repository, with the content it must have."""
    history = gen_bench.updated_history(today)
    files: dict[str, str | bytes] = {
        "docs/reference/cli.md": gen_cli.render(),
        "docs/reference/config.md": gen_config.render(),
        "benchmarks/history.json": gen_bench.history_text(history),
    }
    files.update(gen_bench.render_pages(history))
    blocks = {
        "README.md": {"results": gen_bench.headline_table(history, "docs/benchmarks/")},
        "docs/index.md": {"results": gen_bench.headline_table(history, "benchmarks/")},
        "docs/architecture.md": {"layers": gen_layers.render()},
        "mkdocs.yml": {"benchmarks-nav": gen_bench.nav_entries()},
    }
    captured = gen_outputs.load()
    for page in gen_outputs.marked_pages():
        blocks[page.relative_to(ROOT).as_posix()] = gen_outputs.blocks(page, captured)
    for path, named in blocks.items():
        current = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        text = current
        for name, content in named.items():
            text = fill_block(text, name, content, path)
        if current:
            files[path] = text
    return files


def fill_block(text: str, name: str, content: str, path: str) -> str:
    """`text` with the lines between its markers for block `name` replaced by `content`:
    `<!-- generated:NAME -->` ... `<!-- /generated:NAME -->` in Markdown, `# generated:NAME`
    ... `# /generated:NAME` (indented as the list they sit in) in YAML."""
    if path.endswith(".yml"):
        pattern = re.compile(rf"(( *)# generated:{name}\n)(.*?)(\2# /generated:{name})", re.DOTALL)
    else:
        pattern = re.compile(
            rf"(()<!-- generated:{name} -->\n)(.*?)(<!-- /generated:{name} -->)", re.DOTALL
        )
    if text and not pattern.search(text):
        raise SystemExit(f"{path} has no generated:{name} block")
    body = content.rstrip("\n") + "\n" if content.strip() else ""
    return pattern.sub(lambda m: m.group(1) + body + m.group(4), text)


def stale(files: dict[str, str | bytes]) -> list[str]:
    out = []
    for rel, content in files.items():
        path = ROOT / rel
        if not path.exists():
            out.append(rel)
            continue
        current = path.read_bytes() if isinstance(content, bytes) else path.read_text()
        if current != content:
            out.append(rel)
    generated = {p for p in files if p.startswith("docs/benchmarks/")}
    for path in (ROOT / "docs" / "benchmarks").glob("*"):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in generated:
            out.append(f"{rel} (no results file renders it any more)")
    return out


def write(files: dict[str, str | bytes]) -> list[str]:
    written = []
    for rel in stale(files):
        path = ROOT / rel.split(" (")[0]
        if rel not in files:
            path.unlink()  # a page whose results file is gone
            written.append(f"removed {rel.split(' (')[0]}")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        content = files[rel]
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        written.append(rel)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    parser.add_argument(
        "--backfill-history", action="store_true", help="rebuild benchmarks/history.json from git"
    )
    args = parser.parse_args()
    if args.backfill_history:
        gen_bench.HISTORY.write_text(gen_bench.history_text(gen_bench.backfill_history()))
    files = outputs()
    if args.check:
        old = stale(files)
        for rel in old:
            print(f"stale: {rel}", file=sys.stderr)
        if old:
            print("run `make docs` and commit what it writes", file=sys.stderr)
        return 1 if old else 0
    for rel in write(files):
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
