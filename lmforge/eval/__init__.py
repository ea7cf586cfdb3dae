"""Evaluation: validation loss, bits per byte, baselines.

Names import their module (and torch) on first use.
"""

from lmforge.lazy import lazy_exports

_EXPORTS = {
    "EvalResult": "lmforge.eval.bpb",
    "evaluate": "lmforge.eval.bpb",
    "token_byte_lengths": "lmforge.eval.bpb",
    "unigram_bpb": "lmforge.eval.bpb",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
