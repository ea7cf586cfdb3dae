"""Optional dependencies: which extra brings each one, and the one-line error when it is missing.

Heavy or specialised packages live behind pip extras (pyproject.toml) and are imported lazily.
`require(feature, extra, *modules)` checks them before any work starts, so a missing package is
a user error naming the extra to install, never a traceback halfway through a run.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from lmforge.errors import LmforgeError


def missing(*modules: str) -> list[str]:
    """The top-level packages among `modules` that are not installed (nothing is imported)."""
    return [m for m in modules if importlib.util.find_spec(m.split(".")[0]) is None]


def require(feature: str, extra: str, *modules: str, plural: bool = False) -> None:
    """Raise a one-line LmforgeError naming `extra` unless every one of `modules` is installed
    (`plural`: `feature` names several things, which "need" the packages)."""
    absent = missing(*modules)
    if absent:
        need = "need" if plural else "needs"
        raise LmforgeError(
            f"{feature} {need} {', '.join(absent)} (not installed): pip install 'lmforge[{extra}]'"
        )


def import_extra(module: str, feature: str, extra: str) -> ModuleType:
    """Import `module`, or raise the one-line error of `require` when its package is missing."""
    require(feature, extra, module)
    return importlib.import_module(module)
