"""Package exports that import their module on first use.

A package `__init__` that imports its torch-backed modules eagerly makes every command pay
~3 s for `import torch`, even `--help`. `lazy_exports` gives a package PEP 562 attribute
access instead: `from lmforge.model import Transformer` still works, and imports
lmforge.model.transformer (and torch) only then.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """The `__getattr__` of `package`: each name in `exports` comes from its module, on demand."""

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
