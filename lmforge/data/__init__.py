"""Documents: reading raw text, exact deduplication, the validation split, JSONL storage."""

from lmforge.data.dedup import ExactDedup, normalize, text_hash
from lmforge.data.documents import (
    DOC_SEPARATOR,
    Document,
    ReadStats,
    read_documents,
    stdlib_documents,
)
from lmforge.data.split import is_validation, split_score
from lmforge.data.store import read_jsonl, write_jsonl

__all__ = [
    "DOC_SEPARATOR",
    "Document",
    "ExactDedup",
    "ReadStats",
    "is_validation",
    "normalize",
    "read_documents",
    "read_jsonl",
    "split_score",
    "stdlib_documents",
    "text_hash",
    "write_jsonl",
]
