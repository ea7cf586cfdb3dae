"""Evaluation of a checkpoint: validation loss, bits per byte, baselines (measured by
lmforge.train.bpb, the same code periodic validation runs).

Names import their module (and torch) on first use.
"""

from lmforge.lazy import lazy_exports

_EXPORTS = {
    "EvalResult": "lmforge.train.bpb",
    "evaluate": "lmforge.train.bpb",
    "token_byte_lengths": "lmforge.train.bpb",
    "unigram_bpb": "lmforge.train.bpb",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
