"""Evaluation: validation loss, bits per byte, baselines."""

from lmforge.eval.bpb import EvalResult, evaluate, token_byte_lengths, unigram_bpb

__all__ = ["EvalResult", "evaluate", "token_byte_lengths", "unigram_bpb"]
