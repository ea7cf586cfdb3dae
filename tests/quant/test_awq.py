"""AWQ: folding its scales leaves the fp32 model's function unchanged, and int4 quantization
after AWQ reconstructs the model's outputs on calibration data better than plain RTN.

Random weights give activations without outlier channels, where AWQ has nothing to gain; the
model here is built with a few outlier channels in every Linear's input (large norm gains and
large value/up rows), as trained LLMs have.
"""

import functools

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.model.config import ModelConfig
from lmforge.model.transformer import Transformer
from lmforge.quant.awq import apply_awq
from lmforge.quant.calibration import block_linears
from lmforge.quant.schemes import fake_quantize


def outlier_model(n_kv_heads: int = 2, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=64,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        d_ff=128,
        max_seq_len=32,
    )
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for block in model.layers:
            for norm in (block.attn_norm, block.mlp_norm):
                norm.weight[torch.randperm(64)[:4]] = 12.0
            block.attn.v_proj.weight[torch.randperm(32)[:3]] *= 10.0
            block.mlp.up_proj.weight[torch.randperm(128)[:6]] *= 10.0
    return model


def calibration(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (8, 32), generator=torch.Generator().manual_seed(seed))


def counting_batch(seed: int, rows: int = 16) -> torch.Tensor:
    """Rows counting upward mod 64 from a random start in steps of 1-3: easy to learn."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, 64, (rows, 1), generator=g)
    step = torch.randint(1, 4, (rows, 1), generator=g)
    return (start + step * torch.arange(33)) % 64


@functools.cache
@torch.enable_grad()
def _trained_state() -> dict:
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(
            vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=32
        )
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(300):
        ids = counting_batch(100 + step)
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def trained_model() -> Transformer:
    """A tiny model trained for 300 steps (about 2 s) on counting sequences, fresh each call."""
    cfg = ModelConfig(
        vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=32
    )
    model = Transformer(cfg)
    model.load_state_dict(_trained_state())
    return model.eval()


def rtn(model: Transformer, scheme: str, group_size: int) -> Transformer:
    with torch.no_grad():
        for block in model.layers:
            for linear in block_linears(block).values():
                linear.weight.copy_(fake_quantize(linear.weight, scheme, group_size))
    return model


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_folding_preserves_the_fp32_model(n_kv_heads):
    model, ids = outlier_model(n_kv_heads), calibration()
    with torch.no_grad():
        before = model(ids)
    stats = apply_awq(model, ids, "int4", 32, grid=10, clip=False)
    with torch.no_grad():
        after = model(ids)
    assert any(v["alpha"] > 0 for k, v in stats.items() if k != "skipped")  # something was folded
    # fp32 rounding only: within 1e-5 of the logits' scale (the outlier gains make them large)
    torch.testing.assert_close(after, before, atol=1e-5 * before.abs().max().item(), rtol=1e-5)


@pytest.mark.parametrize("group_size", [32, 64])
def test_awq_beats_rtn_on_calibration_outputs(group_size):
    ids = calibration()
    with torch.no_grad():
        ref = outlier_model()(ids)
    plain = rtn(outlier_model(), "int4", group_size)
    awq_model = outlier_model()
    stats = apply_awq(awq_model, ids, "int4", group_size, grid=10)
    rtn(awq_model, "int4", group_size)
    with torch.no_grad():
        err_rtn = (plain(ids) - ref).pow(2).mean().item()
        err_awq = (awq_model(ids) - ref).pow(2).mean().item()
    assert err_awq < 0.8 * err_rtn
    groups = {k: v for k, v in stats.items() if k != "skipped"}
    assert len(groups) == 8 and stats["skipped"] == []
    assert all(v["error_awq"] <= v["error_rtn"] for v in groups.values())


def test_bad_input_is_refused_before_anything_changes():
    model = outlier_model()
    weights = {n: p.clone() for n, p in model.named_parameters()}
    with pytest.raises(LmforgeError, match="grid"):
        apply_awq(model, calibration(), "int4", 32, grid=0)
    with pytest.raises(LmforgeError, match="group size 128"):  # d_model 64 is not a multiple
        apply_awq(model, calibration(), "int4", 128)
    with pytest.raises(LmforgeError, match="calibration"):
        apply_awq(model, calibration().float(), "int4", 32)
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())


def test_moe_mlps_are_skipped_and_attention_still_folds():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_experts=4, d_ff=64)
    model, ids = Transformer(cfg).eval(), calibration()
    with torch.no_grad():
        before = model(ids)
    stats = apply_awq(model, ids, "int4", 32, grid=4, clip=False)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), before, atol=1e-5, rtol=1e-5)
    assert len(stats["skipped"]) == 2 and "layers.0.mlp.gate_up" not in stats
    assert "layers.1.attn.o_proj" in stats


def test_awq_beats_rtn_on_a_briefly_trained_model():
    """Held-out data: the calibration batch and the measured batch differ."""
    ids, cal = counting_batch(1)[:, :32], counting_batch(2)[:, :32]
    with torch.no_grad():
        ref = trained_model()(ids)
    plain = rtn(trained_model(), "int4", 32)
    model = trained_model()
    apply_awq(model, cal, "int4", 32)
    rtn(model, "int4", 32)
    with torch.no_grad():
        assert (model(ids) - ref).pow(2).mean() < (plain(ids) - ref).pow(2).mean()
