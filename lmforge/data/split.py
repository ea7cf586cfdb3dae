"""The held-out validation split, chosen by a stable hash of the document id.

The same id lands in the same split on every machine and every run, whatever the order of the
documents or the size of the corpus, so validation numbers stay comparable across runs.
"""

from __future__ import annotations

import hashlib


def split_score(doc_id: str) -> float:
    """A number in [0, 1) that depends only on the id."""
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def is_validation(doc_id: str, fraction: float) -> bool:
    return split_score(doc_id) < fraction
