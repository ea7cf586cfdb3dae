"""The pipeline's configuration: inputs, output, step list, executor, and each step's settings.

Settings come from a TOML file, then command-line flags, then `--set section.key=value`
overrides (a section is a step name, `read` or `write`; nested tables such as
`quality.gopher.min_words` are reached with more dots). Unknown keys are rejected with the valid
ones listed. The resolved config is a plain dict that workers rebuild the steps from.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.data.pipeline.registry import STEPS
from lmforge.data.readers import ReadConfig
from lmforge.errors import LmforgeError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

FORMATS = ("jsonl", "jsonl.zst", "parquet")
EXECUTORS = ("local", "ray")


@dataclass
class WriteConfig:
    format: str = "jsonl.zst"  # jsonl, jsonl.zst or parquet


@dataclass
class PipelineConfig:
    input: list[str] = field(default_factory=list)
    output: str = ""
    steps: list[str] = field(default_factory=list)
    workers: int = 1  # 0: all cores
    executor: str = "local"
    address: str = ""  # Ray cluster address; empty starts a local Ray instance
    read: ReadConfig = field(default_factory=ReadConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    step_config: dict[str, Any] = field(default_factory=dict)  # step name -> its Config

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["read"], out["write"] = dataclasses.asdict(self.read), dataclasses.asdict(self.write)
        out["step_config"] = {k: dataclasses.asdict(v) for k, v in self.step_config.items()}
        return out

    @classmethod
    def from_dict(cls, obj: dict) -> PipelineConfig:
        cfg = cls(**{k: v for k, v in obj.items() if k not in ("read", "write", "step_config")})
        cfg.read = _apply(ReadConfig(), obj.get("read", {}), "read")
        cfg.write = _apply(WriteConfig(), obj.get("write", {}), "write")
        for name, values in obj.get("step_config", {}).items():
            cfg.step_config[name] = _apply(STEPS[name].Config(), values, name)
        return cfg


def load_pipeline_config(
    path: str | None = None, flags: dict[str, Any] | None = None, overrides: list[str] = ()
) -> PipelineConfig:
    """The TOML file (if any), then flags that were given, then `--set` overrides; validated."""
    values: dict[str, Any] = {}
    if path:
        try:
            values = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as e:
            raise LmforgeError(f"config file {path} does not exist: check the path") from e
        except tomllib.TOMLDecodeError as e:
            raise LmforgeError(f"config file {path} is not valid TOML: {e}") from e
    for key, value in (flags or {}).items():
        if value is not None:
            values[key] = value
    for item in overrides:
        dotted, sep, raw = item.partition("=")
        keys = dotted.strip().split(".")
        if not sep or len(keys) < 2:
            raise LmforgeError(f"--set {item!r} is not of the form step.key=value")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()  # a bare word is a string
        table = values
        for key in keys[:-1]:
            table = table.setdefault(key, {})
        table[keys[-1]] = value
    return _build(values)


def _build(values: dict[str, Any]) -> PipelineConfig:
    cfg = PipelineConfig()
    top = {"input", "output", "steps", "workers", "executor", "address"}
    sections = {"read", "write", *STEPS}
    for key, value in values.items():
        if key in top:
            setattr(cfg, key, _coerce(value, typing.get_type_hints(PipelineConfig)[key], key))
        elif key == "read":
            cfg.read = _apply(cfg.read, value, key)
        elif key == "write":
            cfg.write = _apply(cfg.write, value, key)
        elif key in STEPS:
            cfg.step_config[key] = _apply(STEPS[key].Config(), value, key)
        else:
            valid = ", ".join(sorted(top | sections))
            raise LmforgeError(f"unknown pipeline setting {key!r}; valid: {valid}")
    if isinstance(cfg.steps, str):
        cfg.steps = [s for s in cfg.steps.split(",") if s]
    _validate(cfg)
    for name in cfg.steps:
        cfg.step_config.setdefault(name, STEPS[name].Config())
    return cfg


def _validate(cfg: PipelineConfig) -> None:
    if not cfg.input:
        raise LmforgeError("no input: pass --input PATH... (files, folders, stdlib or hf:NAME)")
    if not cfg.output:
        raise LmforgeError("no output folder: pass --output DIR")
    unknown = [s for s in cfg.steps if s not in STEPS]
    if unknown:
        raise LmforgeError(f"unknown step(s) {unknown}: choose from {', '.join(STEPS)}")
    if len(set(cfg.steps)) != len(cfg.steps):
        raise LmforgeError(f"steps {cfg.steps} name a step twice: list each step once")
    if cfg.write.format not in FORMATS:
        raise LmforgeError(f"write.format {cfg.write.format!r} is unknown: use {FORMATS}")
    if cfg.executor not in EXECUTORS:
        raise LmforgeError(f"executor {cfg.executor!r} is unknown: use local or ray")
    if cfg.workers < 0:
        raise LmforgeError("workers must be 0 (all cores) or more")


def _apply(obj: Any, values: Any, where: str) -> Any:
    if not isinstance(values, dict):
        raise LmforgeError(f"[{where}] must be a table of settings")
    fields = {f.name for f in dataclasses.fields(obj)}
    hints = typing.get_type_hints(type(obj))
    changes = {}
    for key, value in values.items():
        if key not in fields:
            valid = ", ".join(sorted(fields)) or "(none)"
            raise LmforgeError(f"unknown setting {where}.{key}; valid keys: {valid}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            changes[key] = _apply(current, value, f"{where}.{key}")
        else:
            changes[key] = _coerce(value, hints[key], f"{where}.{key}")
    return dataclasses.replace(obj, **changes)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint) or hint
    if origin is list:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if isinstance(value, list):
            (inner,) = typing.get_args(hint) or (Any,)
            return [_coerce(v, inner, key) for v in value] if inner is not Any else value
    elif origin is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    elif origin is Any or (isinstance(value, origin) and not _bool_for_number(value, origin)):
        return value
    name = getattr(origin, "__name__", str(origin))
    raise LmforgeError(f"{key} must be {name}, got {value!r}")


def _bool_for_number(value: Any, origin: Any) -> bool:
    return isinstance(value, bool) and origin in (int, float)
