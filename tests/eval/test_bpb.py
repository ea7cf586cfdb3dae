import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmforge.errors import LmforgeError
from lmforge.eval import evaluate, token_byte_lengths, unigram_bpb
from lmforge.model import ModelConfig, Transformer
from lmforge.tokenizer import Tokenizer, train_bpe


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(["hello world, hello there. é" * 20], 280)


def test_byte_lengths_are_utf8_lengths_and_zero_for_specials(tokenizer):
    lengths = token_byte_lengths(tokenizer)
    assert len(lengths) == tokenizer.vocab_size
    assert lengths[tokenizer.eot_id] == 0
    for i in range(tokenizer.vocab_size):
        if i != tokenizer.eot_id:
            assert lengths[i] == len(tokenizer.token_bytes(i)) >= 1


def test_bpb_equals_a_direct_computation(tokenizer):
    model = Transformer(
        ModelConfig(
            vocab_size=tokenizer.vocab_size, d_model=32, n_layers=1, n_heads=2, max_seq_len=16
        )
    )
    ids = [tokenizer.eot_id, *tokenizer.encode_ordinary("hello world, hello there. é" * 3)]
    data = np.asarray(ids, dtype=np.uint16)
    lengths = token_byte_lengths(tokenizer)
    result = evaluate(model, data, lengths, context_length=16, batch_size=2, max_batches=10)

    nats, n_bytes, n_tokens = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(data) - 16, 16):
            window = torch.tensor(data[start : start + 17].astype(np.int64))
            logp = F.log_softmax(model(window[None, :-1])[0].double(), dim=-1)
            for pos, target in enumerate(window[1:].tolist()):
                if lengths[target] > 0:
                    nats -= float(logp[pos, target])
                    n_bytes += int(lengths[target])
                    n_tokens += 1
    assert result.tokens == n_tokens and result.bytes == n_bytes
    assert result.loss == pytest.approx(nats / n_tokens, rel=1e-5)
    assert result.bpb == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)


def test_unigram_bpb_matches_entropy_formula():
    tok = Tokenizer({bytes([i]): i for i in range(256)}, {"<|endoftext|>": 256})
    lengths = token_byte_lengths(tok)
    train = np.array([97] * 6 + [98] * 2 + [256] * 5)
    val = np.array([97, 98, 256, 97])
    counts = np.ones(256)
    counts[97] += 6
    counts[98] += 2
    p = counts / counts.sum()
    expected = -(2 * math.log2(p[97]) + math.log2(p[98])) / 3
    assert unigram_bpb(train, val, lengths) == pytest.approx(expected)


def test_too_little_validation_data_is_a_clear_error(tokenizer):
    model = Transformer(
        ModelConfig(
            vocab_size=tokenizer.vocab_size, d_model=32, n_layers=1, n_heads=2, max_seq_len=16
        )
    )
    with pytest.raises(LmforgeError, match="fewer than one window"):
        evaluate(model, np.zeros(5, dtype=np.uint16), token_byte_lengths(tokenizer), 16, 1, 1)
