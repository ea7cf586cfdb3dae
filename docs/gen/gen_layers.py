"""The layers section of docs/architecture.md, read from the import-linter contracts in
pyproject.toml (`[tool.importlinter]`), which `make test` checks with lint-imports: the layer
order top to bottom and every other contract, so the page cannot drift from what is enforced.
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def contracts() -> list[dict]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["tool"]["importlinter"]["contracts"]


def render() -> str:
    out = []
    for contract in contracts():
        if contract["type"] != "layers":
            continue
        out += [
            f"**{contract['name']}.** From the top, each layer may import any layer below it "
            "and none above; modules in one row are side by side and may not import each "
            "other; a name in parentheses is an optional layer (the contract holds whether or "
            "not it exists).",
            "",
            "| | layer | what it holds |",
            "|---|---|---|",
        ]
        for i, layer in enumerate(contract["layers"], 1):
            modules = [m.strip() for m in layer.split("|")]
            names = " · ".join(f"`{m}`" for m in modules)
            held = "<br>".join(
                f"`{m.strip('()')}`: {_summary(m)}" if len(modules) > 1 else _summary(m)
                for m in modules
            )
            out.append(f"| {i} | {names} | {held} |")
        out.append("")
    others = [c for c in contracts() if c["type"] != "layers"]
    if others:
        out += ["The other contracts:", ""]
        for contract in others:
            out.append(f"- **{contract['name']}** ({_detail(contract)})")
        out.append("")
    return "\n".join(out)


def _summary(module: str) -> str:
    """The first sentence of the module's docstring (a package's __init__.py)."""
    import ast

    name = module.strip("()")
    base = ROOT / "lmforge" / name
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    if not path.exists():
        return "reserved"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return first.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _detail(contract: dict) -> str:
    def names(key: str) -> str:
        return ", ".join(f"`{m}`" for m in contract.get(key, []))

    if contract["type"] == "forbidden":
        return f"{names('source_modules')} may not import {names('forbidden_modules')}"
    if contract["type"] == "independence":
        return f"{names('modules')} import none of each other"
    return contract["type"]
