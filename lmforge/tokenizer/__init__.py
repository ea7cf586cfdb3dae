"""Byte-level BPE tokenizer: training, tiktoken-compatible encoding, GPT-2/HF/tiktoken files."""

from lmforge.tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN, PATTERNS
from lmforge.tokenizer.sources import InputStats
from lmforge.tokenizer.tokenizer import Tokenizer
from lmforge.tokenizer.train import train_bpe, train_bpe_files

__all__ = [
    "GPT2_PATTERN",
    "GPT4_PATTERN",
    "PATTERNS",
    "InputStats",
    "Tokenizer",
    "train_bpe",
    "train_bpe_files",
]
