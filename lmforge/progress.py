"""Progress bars for long work: one place that decides how bars look and when they show.

Set LMFORGE_PROGRESS=0 to silence them (tests and logs do).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def enabled() -> bool:
    return os.environ.get("LMFORGE_PROGRESS", "1") != "0"


def bar(iterable: Iterable[T] | None = None, **kwargs: Any) -> tqdm:
    """A tqdm bar with rate and ETA; `desc`, `total` and `unit` pass through."""
    kwargs.setdefault("dynamic_ncols", True)
    kwargs.setdefault("leave", True)
    return tqdm(iterable, disable=not enabled(), **kwargs)
