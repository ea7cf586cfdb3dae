"""Planned training memory against the real tensors: P, G and OS bytes exactly, and the saved
activations per layer (saved-tensor hooks, train/memory.py) within 10%."""

import dataclasses

import pytest
import torch

from lmforge.config import PRESETS
from lmforge.model import Transformer
from lmforge.plan.layout import Layout
from lmforge.plan.memory import activation_bytes_per_layer, head_activation_bytes, state_bytes
from lmforge.plan.precision import precision_bytes
from lmforge.plan.shapes import from_model_config
from lmforge.train.master import ComputeCopy
from lmforge.train.memory import apply_activation_checkpointing, saved_activation_bytes
from lmforge.train.optimizers import build_optimizer

BATCH, SEQ = 2, 64


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def moments_bytes(optimizer, params) -> int:
    """exp_avg and exp_avg_sq (the scalar step counters, 4 B per tensor, are left out)."""
    return sum(
        nbytes(v for k, v in optimizer.state[p].items() if k.startswith("exp_avg")) for p in params
    )


def one_step(model: Transformer, optimizer_model: Transformer):
    optimizer = build_optimizer(optimizer_model, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
    model(ids).float().logsumexp(-1).mean().backward()
    return optimizer


@pytest.mark.parametrize("change", [{}, {"n_kv_heads": 2, "tie_embeddings": True}])
def test_fp32_state_bytes_equal_the_real_tensors(change):
    cfg = dataclasses.replace(PRESETS["tiny"]().model, **change)
    model = Transformer(cfg)
    optimizer = one_step(model, model)
    params = list(model.parameters())
    grads = [p.grad for p in params]
    optimizer.step()
    planned = state_bytes(from_model_config("t", cfg), Layout(), precision_bytes("fp32"))
    assert planned.params == nbytes(params)
    assert planned.grads == nbytes(grads)
    assert planned.optimizer == moments_bytes(optimizer, params)


def test_mixed_precision_state_bytes_equal_the_real_tensors():
    """bf16 compute copy (P, G) and an fp32 master copy with Adam's moments (OS)."""
    cfg = PRESETS["tiny"]().model
    master = Transformer(cfg)
    copy = ComputeCopy(master, torch.device("cpu"), torch.bfloat16)
    optimizer = one_step(copy.module, master)
    compute_params = list(copy.module.parameters())
    grads = [p.grad for p in compute_params]
    planned = state_bytes(from_model_config("t", cfg), Layout(), precision_bytes("bf16"))
    assert planned.params == nbytes(compute_params)
    assert planned.grads == nbytes(grads)
    copy.grads_to_master()
    optimizer.step()
    master_params = list(master.parameters())
    assert planned.optimizer == nbytes(master_params) + moments_bytes(optimizer, master_params)


def test_sharding_divides_by_the_zero_stage():
    shape = from_model_config("t", PRESETS["small"]().model)
    bf16 = precision_bytes("bf16")
    alone = state_bytes(shape, Layout(), bf16)
    zero1 = state_bytes(shape, Layout(dp=4, zero=1), bf16)
    fsdp = state_bytes(shape, Layout(fsdp=4), bf16)
    assert (zero1.params, zero1.grads) == (alone.params, alone.grads)
    assert zero1.optimizer == pytest.approx(alone.optimizer / 4, abs=16)
    assert fsdp.total == pytest.approx(alone.total / 4, abs=64)
    assert state_bytes(shape, Layout(dp=4, zero=3), bf16) == fsdp


def measured_per_layer(cfg, mode: str, dtype: torch.dtype) -> int:
    """Saved bytes of a 2-layer model minus those of a 1-layer one: one block's share."""
    saved = []
    for n_layers in (1, 2):
        torch.manual_seed(0)
        model = Transformer(dataclasses.replace(cfg, n_layers=n_layers)).to(dtype)
        apply_activation_checkpointing(model, mode)
        ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
        saved.append(saved_activation_bytes(model, lambda m=model, ids=ids: m(ids).float().sum()))
    return saved[1] - saved[0]


@pytest.mark.parametrize("mode", ["none", "full", "selective"])
@pytest.mark.parametrize(
    ("dtype", "change"),
    [
        (torch.float32, {}),
        (torch.bfloat16, {"n_kv_heads": 2}),
        (torch.float32, {"n_experts": 4, "experts_per_token": 2}),
    ],
)
def test_activation_bytes_per_layer_match_saved_tensor_hooks(mode, dtype, change):
    cfg = dataclasses.replace(PRESETS["tiny"]().model, **change)
    e = torch.finfo(dtype).bits // 8
    predicted = activation_bytes_per_layer(from_model_config("t", cfg), BATCH, SEQ, mode, e)
    assert predicted == pytest.approx(measured_per_layer(cfg, mode, dtype), rel=0.10)


@pytest.mark.parametrize("mode", ["none", "full"])
def test_whole_model_saved_bytes_with_the_loss_within_ten_percent(mode):
    cfg = PRESETS["tiny"]().model
    model = Transformer(cfg)
    apply_activation_checkpointing(model, mode)
    ids, targets = torch.randint(0, cfg.vocab_size, (2, BATCH, SEQ))

    def loss():
        logits = model(ids).float().flatten(0, 1)
        return torch.nn.functional.cross_entropy(logits, targets.flatten())

    shape = from_model_config("t", cfg)
    predicted = cfg.n_layers * activation_bytes_per_layer(shape, BATCH, SEQ, mode, 4)
    predicted += head_activation_bytes(shape, BATCH, SEQ, 4)
    assert predicted == pytest.approx(saved_activation_bytes(model, loss), rel=0.10)
