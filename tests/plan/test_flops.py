"""Planned training FLOPs agree with torch's FlopCounterMode on the real model within 2%.

Attention runs on SDPA's math backend here: its QKᵀ and PV are then plain bmm's the counter
sees (the fused CPU kernel is invisible to it).
"""

import dataclasses

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lmforge.config import PRESETS
from lmforge.model import Transformer
from lmforge.plan.flops import attention_flops_per_token, training_flops_per_token
from lmforge.plan.shapes import from_model_config

BATCH, SEQ = 2, 64


@pytest.mark.parametrize(
    "change",
    [{}, {"n_kv_heads": 2}, {"tie_embeddings": True}, {"n_experts": 4, "experts_per_token": 2}],
)
def test_training_flops_match_flop_counter(change):
    cfg = dataclasses.replace(PRESETS["tiny"]().model, **change)
    model = Transformer(cfg)
    shape = from_model_config("t", cfg)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids).float().logsumexp(-1).mean().backward()
    counts = counter.get_flop_counts()["Global"]
    tokens = BATCH * SEQ
    predicted = training_flops_per_token(shape, SEQ) * tokens
    assert predicted == pytest.approx(counter.get_total_flops(), rel=0.02)
    attention = 3 * attention_flops_per_token(shape, SEQ) * tokens
    assert attention == pytest.approx(counts[torch.ops.aten.bmm], rel=0.02)
    matmuls = counts[torch.ops.aten.mm] + counts.get(torch.ops.aten._grouped_mm, 0)
    assert predicted - attention == pytest.approx(matmuls, rel=0.02)
    if not cfg.tie_embeddings:  # the model's own estimate agrees (it drops a tied head's matmul)
        assert model.flops_per_token(SEQ) * tokens == pytest.approx(predicted, rel=0.02)
