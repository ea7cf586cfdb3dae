"""docs/reference/config.md from the config dataclasses: every key of a run config (model,
tokenizer, data, train), of `lmforge rl` and of `lmforge data run`, with its type, default,
allowed range or choices (the `ranged`/`one_of` metadata of lmforge/config_ranges.py) and the
comment written beside the field; and what each named preset changes.

Generated, never edited by hand: `make docs` rewrites it, tests/docs/test_generated.py checks it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import math
import textwrap
import tokenize
from typing import Any


def render() -> str:
    from lmforge.config import PRESETS, TOP_LEVEL, RunConfig
    from lmforge.data.pipeline.config import EXECUTORS, FORMATS, PipelineConfig, WriteConfig
    from lmforge.data.pipeline.registry import STEPS
    from lmforge.data.read_units import ReadConfig
    from lmforge.posttrain.rl_config import RlConfig

    default = RunConfig()
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from the config dataclasses by docs/gen/gen_config.py (`make docs`). "
        "Do not edit. -->",
        "",
        "Every setting lmforge reads, generated from the dataclasses that hold them, with its "
        "default and the values it accepts. A value out of range is a one-line error naming "
        "the key, before any work starts; an unknown key is an error listing the valid ones.",
        "",
        "## Run config",
        "",
        "`lmforge train`, `lmforge speedrun` and `lmforge sft` build one run config: a preset "
        "(`--preset`, default `auto`), then a TOML file (`--config FILE.toml`, one table per "
        "section), then `--set SECTION.KEY=VALUE` overrides (the value is read as TOML: `3`, "
        '`1e-3`, `true`, `"x"`; a bare word is a string). The resolved config is saved as '
        "`config.toml` in the run folder.",
        "",
        "```toml",
        "# my.toml: lmforge train --config my.toml --set train.optimizer.lr=2e-3",
        "[model]",
        "d_model = 384",
        "n_layers = 6",
        "",
        "[train]",
        "minutes = 30",
        "```",
        "",
        "### Top level",
        "",
    ]
    top = [f for f in dataclasses.fields(RunConfig) if f.name in TOP_LEVEL]
    out += _table(RunConfig, top, default, "")
    for f in dataclasses.fields(RunConfig):
        if f.name in TOP_LEVEL:
            continue
        section = getattr(default, f.name)
        out += [f"### `[{f.name}]`", "", SECTIONS[f.name], ""]
        out += _table(type(section), dataclasses.fields(section), section, f"{f.name}.")
    out += ["## Presets", "", "What each preset sets, beside the defaults above:", ""]
    out += ["| preset | what it is | settings that differ from the defaults |", "|---|---|---|"]
    for name, make in PRESETS.items():
        changes = _differences(make(), default)
        out.append(f"| `{name}` | {_cell(_first_paragraph(make))} | {changes} |")
    out += [
        "",
        "## `lmforge rl`",
        "",
        "GRPO's settings: the flags of `lmforge rl` set the common ones, `--set rl.KEY=VALUE` "
        "any of them. A run records them in `rl_config.json` in its folder.",
        "",
    ]
    out += _table(RlConfig, dataclasses.fields(RlConfig), RlConfig(), "rl.")
    out += [
        "## `lmforge data run`",
        "",
        "A pipeline is a TOML file (`--config`), then the command's flags, then "
        "`--set SECTION.KEY=VALUE` overrides, where a section is `read`, `write` or a step's "
        "name (nested tables take more dots: `quality.gopher.min_words`). "
        "`examples/pipeline.toml` is a complete example.",
        "",
        "### Top level",
        "",
    ]
    pipeline = [
        f
        for f in dataclasses.fields(PipelineConfig)
        if f.name not in ("read", "write", "step_config")
    ]
    extra = {"executor": f"one of {_choices(EXECUTORS)}"}
    out += _table(PipelineConfig, pipeline, PipelineConfig(), "", extra)
    out += ["### `[read]`", ""]
    out += _table(ReadConfig, dataclasses.fields(ReadConfig), ReadConfig(), "read.")
    out += ["### `[write]`", ""]
    out += _table(
        WriteConfig,
        dataclasses.fields(WriteConfig),
        WriteConfig(),
        "write.",
        {"format": f"one of {_choices(FORMATS)}"},
    )
    for name, step in STEPS.items():
        out += [f"### `[{name}]`", "", _cell(_first_paragraph(step)), ""]
        config = step.Config()
        if dataclasses.fields(config):
            out += _table(step.Config, dataclasses.fields(config), config, f"{name}.")
        else:
            out += ["No settings.", ""]
    return "\n".join(out).rstrip() + "\n"


def _table(cls, fields, instance, prefix: str, extra: dict | None = None) -> list[str]:
    comments = _field_comments(cls)
    rows = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    nested = []
    for f in fields:
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            nested.append((f, value))
            continue
        allowed = _allowed(f, value) or (extra or {}).get(f.name, "")
        rows.append(
            f"| `{prefix}{f.name}` | {_type(cls, f)} | {_value(value)} | {allowed} | "
            f"{_cell(comments.get(f.name, ''))} |"
        )
    rows.append("")
    for f, value in nested:
        name = f"{prefix}{f.name}"
        rows += [f"#### `[{name}]`", "", _cell(_first_paragraph(type(value))), ""]
        rows += _table(type(value), dataclasses.fields(value), value, f"{name}.")
    return rows


def _allowed(f: dataclasses.Field, value: Any) -> str:
    allowed = f.metadata.get("range")
    choices = f.metadata.get("choices")
    if choices is not None:
        return f"one of {_choices(choices)}"
    if allowed is not None:
        return str(allowed) + (" or unset" if value is None else "")
    if isinstance(value, bool):
        return "`true`, `false`"
    return ""


def _choices(choices) -> str:
    return ", ".join(f"`{c}`" for c in choices)


def _type(cls, f: dataclasses.Field) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return " or ".join(part.strip() for part in t.split("|"))


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and math.isfinite(value):
        return f"`{value!r}`"
    if isinstance(value, (str, list, dict)):
        text = json.dumps(value, ensure_ascii=False)
        if "|" in text:  # a table cell's code span cannot hold a pipe: plain text instead
            return _cell(text)
        return f"`{text}`"
    return f"`{value}`"


def _differences(cfg, default, prefix: str = "") -> str:
    changes = []
    for f in dataclasses.fields(cfg):
        a, b = getattr(cfg, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(a):
            inner = _differences(a, b, f"{prefix}{f.name}.")
            if inner:
                changes.append(inner)
        elif a != b:
            changes.append(f"`{prefix}{f.name}` {_value(a).strip('`')}")
    return ", ".join(changes)


def _field_comments(cls) -> dict[str, str]:
    """The comment on each field's line, else the comment lines directly above it."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    body = ast.parse(source).body[0].body
    out = {}
    for node in body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        trailing = [comments[i] for i in range(node.lineno, node.end_lineno + 1) if i in comments]
        above = []
        line = node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        out[node.target.id] = " ".join(trailing) if trailing else " ".join(above)
    return out


SECTIONS = {
    "model": "The model's shape and options (`ModelConfig`, lmforge/model/config.py).",
    "tokenizer": "The BPE tokenizer a run trains (`TokenizerConfig`, lmforge/prepare.py).",
    "data": "The documents a run prepares (`DataConfig`, lmforge/prepare.py).",
    "train": "The training run's settings (`TrainConfig`, lmforge/train/config.py): the run's own "
    "below, then one table per component the run builds (`[train.optimizer]`, "
    "`[train.schedule]`, ...). The flat keys of earlier releases (`train.lr`, `[train] lr = ...`) "
    "still work: each is read as its new key, with a one-line note naming it.",
}


def _first_paragraph(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    if doc.startswith(getattr(obj, "__name__", "?") + "("):  # a dataclass's generated doc
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
