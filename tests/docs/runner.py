"""Runs the shell and Python blocks of a documentation page, as a reader would, at its smallest
scale.

Conventions (docs/tutorials/*.md, docs/concepts/*.md, docs/getting-started.md):

- a page's ```bash and ```python blocks run in order, in one fresh temporary folder, each block
  a process of its own (`bash -e -o pipefail`, or the venv's `python`), with the venv's
  `lmforge` and `python` first on PATH, `LMFORGE_PROGRESS=0` and a temporary `LMFORGE_CACHE`
  shared by the pages of one test session; a block that exits non-zero fails the page;
- an HTML comment directly above a block, `<!-- test: smallest "FROM" "TO" -->`, replaces FROM
  by TO in that block for the test run (several such lines may stack; FROM must occur);
- `<!-- test: skip "REASON" -->` skips the block (only for what cannot exist on one machine);
- ```text, ```console and every other language are never run;
- processes a block leaves in the background (`lmforge serve ... &`) live until the page ends,
  then are stopped with their process groups.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
RUN_LANGUAGES = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)[^\n]*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*test:\s*(?P<kind>\w+)\s*(?P<args>.*?)\s*-->\s*$")


class PageError(Exception):
    """A page whose blocks or directives cannot be run as written."""


@dataclass
class Block:
    lang: str  # as written after the fence
    code: str
    line: int  # the fence's line, 1-based
    skip: str | None = None
    replacements: list[tuple[str, str]] = field(default_factory=list)

    @property
    def kind(self) -> str | None:
        """ "bash" or "python" for a block that runs, None for one that never does."""
        return RUN_LANGUAGES.get(self.lang.lower())

    def test_code(self) -> str:
        code = self.code
        for old, new in self.replacements:
            if old not in code:
                raise PageError(
                    f"line {self.line}: <!-- test: smallest --> replaces {old!r}, which the "
                    "block does not contain"
                )
            code = code.replace(old, new)
        return code


def parse(text: str) -> list[Block]:
    """Every fenced block of a Markdown page with the test directives directly above it."""
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: list[tuple[int, str, list[str]]] = []  # directives waiting for their block
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = DIRECTIVE.match(line)
        if directive:
            try:
                args = shlex.split(directive["args"])
            except ValueError as e:
                raise PageError(f"line {i + 1}: unreadable test directive: {e}") from None
            pending.append((i + 1, directive["kind"], args))
            i += 1
            continue
        fence = FENCE.match(line)
        if fence:
            indent, marker = len(fence["indent"]), fence["fence"]
            body = []
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(marker):
                body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
                j += 1
            block = Block(fence["lang"], "\n".join(body) + "\n", i + 1)
            for at, kind, args in pending:
                _apply(block, at, kind, args)
            pending = []
            blocks.append(block)
            i = j + 1
            continue
        if pending and line.strip():
            at = pending[0][0]
            raise PageError(f"line {at}: a test directive must sit directly above a code block")
        i += 1
    if pending:
        raise PageError(f"line {pending[0][0]}: a test directive with no code block after it")
    return blocks


def _apply(block: Block, at: int, kind: str, args: list[str]) -> None:
    if kind == "smallest" and len(args) == 2:
        block.replacements.append((args[0], args[1]))
    elif kind == "skip" and len(args) == 1 and args[0].strip():
        block.skip = args[0]
    else:
        raise PageError(
            f'line {at}: unknown test directive {kind} {args}: use smallest "FROM" "TO" or '
            'skip "REASON"'
        )


@dataclass
class Ran:
    block: Block
    seconds: float
    skipped: bool = False
    output: str = ""  # what the block printed, stdout and stderr together


class BlockFailed(AssertionError):
    pass


def run_page(
    page: Path,
    workdir: Path,
    cache: Path,
    timeout: float = 600,
    log=None,
    as_written: bool = False,
) -> list[Ran]:
    """Run every runnable block of `page` in `workdir` (at its smallest scale, or `as_written`
    to ignore the `smallest` directives); raise BlockFailed at the first that fails, naming the
    page, the line, the command and the end of its output."""
    blocks = parse(page.read_text())
    workdir.mkdir(parents=True, exist_ok=True)
    scripts = workdir.parent / f"{workdir.name}-blocks"
    scripts.mkdir(exist_ok=True)
    env = page_env(cache)
    groups: list[int] = []
    ran: list[Ran] = []
    try:
        for n, block in enumerate(blocks):
            if block.kind is None:
                continue
            if block.skip is not None:
                ran.append(Ran(block, 0.0, skipped=True))
                continue
            code = block.code if as_written else block.test_code()
            if block.kind == "bash":
                script = scripts / f"block{n}.sh"
                script.write_text(code)
                command = ["bash", "-e", "-o", "pipefail", str(script)]
            else:
                script = scripts / f"block{n}.py"
                script.write_text(code)
                command = [str(BIN / "python"), str(script)]
            output = scripts / f"block{n}.out"
            start = time.monotonic()
            with open(output, "wb") as out:
                process = subprocess.Popen(
                    command,
                    cwd=workdir,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                groups.append(process.pid)
                try:
                    status = process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    status = None
            seconds = time.monotonic() - start
            if log is not None:
                log(f"{page.name}:{block.line} {block.kind} block, {seconds:.1f} s")
            if status != 0:
                tail = output.read_bytes()[-4000:].decode("utf-8", "replace")
                what = "timed out" if status is None else f"exited with status {status}"
                raise BlockFailed(
                    f"{_rel(page)}, the {block.kind} block at line {block.line}, {what} after "
                    f"{seconds:.0f} s (in {workdir}):\n{_indent(code)}\n--- its output, last "
                    f"lines:\n{_indent(tail)}"
                )
            ran.append(Ran(block, seconds, output=output.read_text("utf-8", "replace")))
    finally:
        for group in groups:
            _stop_group(group)
    return ran


def page_env(cache: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "COV_")) and k not in ("VIRTUAL_ENV",)
    }
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(BIN.parent),
        LMFORGE_PROGRESS="0",
        LMFORGE_CACHE=str(cache),
        PYTHONUNBUFFERED="1",
        MPLBACKEND="Agg",
    )
    return env


def pages() -> list[Path]:
    """The pages whose blocks are run: the tutorials, the concepts and getting started."""
    found = sorted((DOCS / "tutorials").glob("*.md")) + sorted((DOCS / "concepts").glob("*.md"))
    return [DOCS / "getting-started.md", *found]


def every_page() -> list[Path]:
    """Every page of the site, for the checks that do not run anything."""
    return sorted(p for p in DOCS.rglob("*.md") if "gen" not in p.relative_to(DOCS).parts)


def _stop_group(pgid: int) -> None:
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)


def _rel(page: Path) -> str:
    try:
        return str(page.relative_to(ROOT))
    except ValueError:
        return str(page)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


def command_errors(block: Block) -> list[str]:
    """What is wrong with a block as a reader would run it, without running it: a Python block
    that does not compile, an `lmforge` command (also `python -m lmforge`, `torchrun ... -m
    lmforge`) that its parser refuses. Arguments that hold shell expansions are not judged."""
    if block.kind == "python":
        try:
            compile(block.code, f"<block at line {block.line}>", "exec")
        except SyntaxError as e:
            return [f"line {block.line}: Python block does not compile: {e}"]
        return []
    if block.kind != "bash":
        return []
    from lmforge.cli import build_parser

    errors = []
    for argv in lmforge_commands(block.code):
        if any("$" in a or "`" in a or "*" in a for a in argv):
            continue
        parser = build_parser()
        try:
            _quiet_parse(parser, argv)
        except SystemExit as e:
            if e.code:
                errors.append(f"line {block.line}: `lmforge {shlex.join(argv)}`: {e}")
    return errors


def lmforge_commands(code: str) -> list[list[str]]:
    """The arguments of every lmforge command in a shell script."""
    text = re.sub(r"\\\n", " ", code)
    found = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError:
            continue
        segment: list[str] = []
        for token in [*tokens, ";"]:
            if token and set(token) <= set(";&|()<>"):
                args = _lmforge_args(segment)
                if args is not None:
                    found.append(args)
                segment = []
            else:
                segment.append(token)
    return found


def _lmforge_args(words: list[str]) -> list[str] | None:
    while words and re.match(r"^\w+=", words[0]):
        words = words[1:]  # VAR=value before the command
    if not words:
        return None
    if Path(words[0]).name == "lmforge":
        return words[1:]
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "lmforge":
            return words[i + 2 :]
    return None


def _quiet_parse(parser, argv: list[str]) -> None:
    import contextlib
    import io

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as e:
        message = stderr.getvalue().strip().splitlines()
        raise SystemExit(message[-1] if message else e.code) from None


def main(argv: list[str] | None = None) -> int:
    """`python tests/docs/runner.py [PAGE ...]`: run pages (default: all) and print each
    block's time; the folders are kept for a look afterwards."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("pages", nargs="*", type=Path)
    parser.add_argument(
        "--as-written", action="store_true", help="ignore the smallest-scale directives"
    )
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="lmforge-docs-"))
    failed = 0
    for page in args.pages or pages():
        start = time.monotonic()
        try:
            run_page(
                page.resolve(),
                root / page.stem,
                root / "cache",
                log=print,
                as_written=args.as_written,
            )
            print(f"ok   {_rel(page.resolve())} in {time.monotonic() - start:.1f} s")
        except (BlockFailed, PageError) as e:
            failed += 1
            print(f"FAIL {e}")
    print(f"folders in {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
