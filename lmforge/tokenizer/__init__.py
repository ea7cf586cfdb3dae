"""Byte-level BPE tokenizer: training, tiktoken-compatible encoding, GPT-2 file format."""

from lmforge.tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN, PATTERNS
from lmforge.tokenizer.tokenizer import Tokenizer
from lmforge.tokenizer.train import train_bpe

__all__ = ["GPT2_PATTERN", "GPT4_PATTERN", "PATTERNS", "Tokenizer", "train_bpe"]
