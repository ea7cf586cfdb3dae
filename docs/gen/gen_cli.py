"""docs/reference/cli.md from the argparse parsers of `lmforge` (lmforge/cli.py and every stage's
command module): each command's usage, description, options with their defaults and choices.

Generated, never edited by hand: `make docs` rewrites it, tests/docs/test_generated.py checks it.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

WIDTH = 96  # usage lines wrap here, whatever the terminal
NOTES = Path(__file__).with_name("cli_notes.md")  # hand-written notes, per command


def render() -> str:
    from lmforge.cli import build_parser

    os.environ["COLUMNS"] = str(WIDTH)  # argparse's usage wrapping reads the terminal width
    parser = build_parser()
    commands = list(_walk(parser, "lmforge"))
    notes = read_notes()
    unknown = sorted(set(notes) - {name for name, _, _ in commands})
    if unknown:
        raise SystemExit(f"{NOTES.name} has notes for commands that do not exist: {unknown}")
    out = [
        "# Command-line reference",
        "",
        "<!-- Generated from the argparse parsers by docs/gen/gen_cli.py (`make docs`). "
        "Do not edit. -->",
        "",
        "Every command and option of `lmforge`, generated from its parsers, so it is always the "
        "command you have. Every command also prints this with `--help`. A user error (a bad "
        "path, an unknown config key) prints one line and exits with status 2; Ctrl-C exits "
        "with 130.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for name, sub, summary in commands[1:]:
        if not _subcommands(sub):
            out.append(f"| [`{name}`](#{_anchor(name)}) | {_cell(summary)} |")
    out.append("")
    for name, sub, summary in commands:
        out += _command(name, sub, summary)
        if name in notes:
            out += [notes[name], ""]
    return "\n".join(out).rstrip() + "\n"


def read_notes() -> dict[str, str]:
    """The notes file's sections by command: a `## ` heading naming it, the text under it."""
    notes: dict[str, str] = {}
    name = None
    for line in NOTES.read_text().splitlines():
        heading = re.match(r"^## `(lmforge[^`]*)`\s*$", line)
        if heading:
            name = heading.group(1)
            notes[name] = ""
        elif name is not None:
            notes[name] += line + "\n"
    return {k: v.strip() for k, v in notes.items()}


def _walk(parser: argparse.ArgumentParser, name: str, summary: str = ""):
    yield name, parser, summary
    for choice, sub, help_text in _subcommands(parser):
        yield from _walk(sub, f"{name} {choice}", help_text)


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(c, p, helps.get(c, "")) for c, p in action.choices.items()]
    return []


def _command(name: str, parser: argparse.ArgumentParser, summary: str) -> list[str]:
    out = [f"## `{name}`", ""]
    if summary:
        out += [_sentence(summary), ""]
    if parser.description and parser.description != summary:
        out += [_escape(parser.description), ""]
    usage = parser.format_usage().removeprefix("usage: ").rstrip()
    usage = usage.replace("\n" + " " * len("usage: "), "\n")
    out += ["```text", usage, "```", ""]
    subs = _subcommands(parser)
    if subs:
        out += ["| subcommand | what it does |", "|---|---|"]
        out += [f"| [`{name} {c}`](#{_anchor(f'{name} {c}')}) | {_cell(h)} |" for c, _, h in subs]
        out.append("")
    options = [a for a in parser._actions if _shown(a)]
    if options:
        out += ["| option | default | what it sets |", "|---|---|---|"]
        out += [_option_row(parser, a) for a in options]
        out.append("")
    if parser.epilog:
        out += ["```text", parser.epilog.rstrip(), "```", ""]
    return out


def _shown(action: argparse.Action) -> bool:
    if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
        return False
    return action.help != argparse.SUPPRESS


def _option_row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    if action.option_strings:
        flag = ", ".join(action.option_strings)
        if action.nargs != 0:
            flag += " " + formatter._format_args(
                action, formatter._get_default_metavar_for_optional(action)
            )
        if action.required:
            flag += " (required)"
    else:
        flag = formatter._format_args(action, formatter._get_default_metavar_for_positional(action))
    help_text = formatter._expand_help(action) if action.help else ""
    if action.choices is not None and action.metavar is not None:
        choices = ", ".join(f"`{c}`" for c in action.choices)
        help_text = f"{help_text} (one of {choices})" if help_text else f"one of {choices}"
    return f"| `{flag}` | {_default(action)} | {_cell(help_text)} |"


def _default(action: argparse.Action) -> str:
    value = action.default
    if isinstance(action, argparse._VersionAction) or value in (None, argparse.SUPPRESS):
        return ""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off" if isinstance(action, argparse._StoreTrueAction) else "on"
    if value == []:
        return ""
    return f"`{value}`"


def _anchor(name: str) -> str:
    """The id Python-Markdown's toc gives the heading `## \\`NAME\\``."""
    return re.sub(r"[^\w\- ]", "", name.lower()).strip().replace(" ", "-")


def _sentence(text: str) -> str:
    text = _escape(text.strip())
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", ")")) else ".")


def _escape(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def _cell(text: str) -> str:
    return _escape(" ".join(text.split())).replace("|", "\\|")
