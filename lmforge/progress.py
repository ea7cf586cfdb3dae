"""Progress bars for long work: one place that decides how bars look and when they show.

Set LMFORGE_PROGRESS=0 to silence them (tests and logs do).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def enabled() -> bool:
    return os.environ.get("LMFORGE_PROGRESS", "1") != "0"


def bar(iterable: Iterable[T] | None = None, **kwargs: Any) -> tqdm:
    """A tqdm bar with rate and ETA; `desc`, `total`, `unit` and `disable` pass through."""
    kwargs.setdefault("dynamic_ncols", True)
    kwargs.setdefault("leave", True)
    kwargs["disable"] = kwargs.get("disable", False) or not enabled()
    return tqdm(iterable, **kwargs)


@contextlib.contextmanager
def bar_per_call(module: Any, **kwargs: Any) -> Iterator[tqdm]:
    """A bar that advances once per forward call of `module` (a torch Module): progress for a
    loop that runs the model inside another function, such as evaluation's batches."""
    with bar(**kwargs) as shown:
        if shown.disable:
            yield shown
            return

        def advance(*args: Any) -> None:  # a hook that returned a value would replace the output
            shown.update()

        handle = module.register_forward_hook(advance)
        try:
            yield shown
        finally:
            handle.remove()
