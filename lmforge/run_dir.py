"""A run folder: claimed by one run, resumed by the same run, refused to any other.

Every command that writes a run (`train`, the speedrun, `sft`, `rl`, the chat speedrun) claims
its folder with `RunDir.claim` before it writes there. The folder records its run's config in
the kind's `config_file` (TOML or JSON, by its suffix). A later claim with the same config
resumes the run; one that changes only the kind's `resumable` settings (its length) resumes it
on them; any other is refused with a one-line message naming the settings that differ, unless
`fresh` starts over. A folder in which the earlier run finished nothing (only what
`RunKind.entries` names, and `RunKind.finished` false) is taken over instead: nothing in it is
worth keeping.

Configs are compared as flat `section.key` dicts after a round trip through the file's format,
so how a value was written (a tuple or a list, a left-out None) never makes two configs differ,
and a folder written by an earlier release resumes while its settings mean the same (the kind's
`upgrade` first brings its recorded config to today's layout: a flat [train] table into its
sections).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from lmforge.atomic import write_text
from lmforge.errors import LmforgeError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


@dataclass(frozen=True)
class RunKind:
    """The rules of one kind of run folder."""

    label: str  # the run in messages: "a run", "an rl run"
    config_file: str  # where the config is recorded: "config.toml" (TOML) or "x.json" (JSON)
    resumable: frozenset[str] = frozenset()  # flat keys a resumed run may change
    change: str = "a new length"  # what changing them gives the run, for the resume message
    entries: tuple[str, ...] = ()  # what the kind writes in its folder before its report
    finished: Callable[[Path], bool] | None = None  # a stage finished (None: never taken over)
    upgrade: Callable[[dict], dict] | None = None  # a recorded config in today's layout

    def dumps(self, config: dict) -> str:
        if self.config_file.endswith(".toml"):
            return tomli_w.dumps(_drop_none(config))  # None means "the default": left out
        return json.dumps(config, indent=2) + "\n"

    def loads(self, text: str) -> dict:
        """The config a file holds; LmforgeError when it cannot be read as its format."""
        try:
            if self.config_file.endswith(".toml"):
                return tomllib.loads(text)
            loaded = json.loads(text)
        except (tomllib.TOMLDecodeError, ValueError) as e:
            raise LmforgeError(f"its {self.config_file} is not valid {self._format}") from e
        if not isinstance(loaded, dict):
            raise LmforgeError(f"its {self.config_file} is not valid {self._format}")
        return loaded

    def upgrade_config(self, config: dict) -> dict:
        """`config`, recorded by an earlier release, in today's layout (`upgrade`)."""
        return self.upgrade(config) if self.upgrade is not None else config

    @property
    def _format(self) -> str:
        return "TOML" if self.config_file.endswith(".toml") else "JSON"


class RunDir:
    """The folder `path` of one run of `kind`."""

    def __init__(self, path: str | Path, kind: RunKind) -> None:
        self.path = Path(path)
        self.kind = kind

    @property
    def config_path(self) -> Path:
        return self.path / self.kind.config_file

    def saved(self) -> dict | None:
        """The config recorded in the folder (None when it has none)."""
        if not self.config_path.is_file():
            return None
        return self.kind.loads(self.config_path.read_text())

    def claim(self, config: Any, fresh: bool = False, quiet: bool = False) -> None:
        """Start over (`fresh`), resume a run of the same `config`, or refuse to mix two runs;
        then record `config` (a dict, or a dataclass: its `asdict`). `quiet`: no messages."""
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            config = dataclasses.asdict(config)
        out, kind = self.path, self.kind

        def say(text: str) -> None:
            if not quiet:
                print(text)

        if fresh and out.exists():
            shutil.rmtree(out)
        if self.config_path.exists():
            changed, shown = self.differences(config)
            if not changed:
                say(f"resuming the run in {out}")
            elif changed <= kind.resumable:
                say(f"resuming the run in {out} with {kind.change} ({shown})")
            elif self._nothing_finished():
                say(f"{out}: its earlier run finished no stage; starting over with this config")
                self._clear()
            else:
                raise LmforgeError(
                    f"{out} holds {kind.label} with another config ({shown}): pass "
                    "--fresh to start over there, or --out for a new run folder"
                )
        write_text(self.config_path, kind.dumps(config))

    def differences(self, config: dict, limit: int = 4) -> tuple[set[str], str]:
        """The flat keys whose values differ between the recorded config and `config`, and
        them shown as `key: old → new, ...` (at most `limit`; an unreadable file says so)."""
        try:
            old = _flat(self.kind.upgrade_config(self.kind.loads(self.config_path.read_text())))
        except LmforgeError as e:
            return {self.kind.config_file}, str(e)
        new = _flat(self.kind.loads(self.kind.dumps(config)))  # as the file would hold it
        keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        shown = [f"{k}: {_show(old.get(k))} → {_show(new.get(k))}" for k in keys[:limit]]
        if len(keys) > limit:
            shown.append(f"and {len(keys) - limit} more")
        return set(keys), ", ".join(shown)

    def _nothing_finished(self) -> bool:
        """Whether no stage finished in the folder (only the kind's entries, none finished;
        names it does not know, and hidden temporary ones, are left alone by refusing)."""
        if self.kind.finished is None:
            return False
        entries = {e.name for e in self.path.iterdir() if not e.name.startswith(".")}
        return entries <= set(self.kind.entries) and not self.kind.finished(self.path)

    def _clear(self) -> None:
        for name in self.kind.entries:
            entry = self.path / name
            if entry.is_dir():
                shutil.rmtree(entry)
            elif entry.exists():
                entry.unlink()


def _flat(obj: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _show(value: Any) -> str:
    if value is None:
        return "(default)"
    return repr(value) if isinstance(value, str) and (not value or " " in value) else str(value)


def _drop_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    return obj
