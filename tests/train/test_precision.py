"""Precision policies: each trains the tiny preset to within a stated tolerance of fp32."""

import dataclasses
import json

import pytest
import torch

from lmforge.config import preset
from lmforge.errors import LmforgeError
from lmforge.model import Linear, ModelConfig, Transformer
from lmforge.train import train
from lmforge.train.fp8 import E4M3, Float8Linear, convert_to_float8
from lmforge.train.loss_scale import DynamicLossScaler
from lmforge.train.precision import make_precision

# Final validation loss (nats/token) may differ from fp32's by at most this much. Measured gaps
# are below 0.005 for every policy; fp8 rounds activations to 3 mantissa bits, hence its margin.
TOLERANCE = {"bf16": 0.02, "fp16": 0.02, "fp8": 0.05}
# Every policy trains as long as one fp32 run it is compared with: 50 steps, long enough for
# the loss to fall by more than 0.5 nats (about 0.8 here) and short enough for bf16, fp16 and
# fp8, whose matmuls have no native kernel on most CPUs (3 to 5x the time of fp32 here).
STEPS = 50


@pytest.fixture(autouse=True)
def one_thread():
    """Small matmuls on a shared 2-core machine run fastest, and steadiest, on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(prepared, out, steps, **precision):
    """A tiny run of `steps` with train.precision's `precision` (dtype, cast_module)."""
    cfg = preset("tiny")
    tcfg = dataclasses.replace(
        cfg.train, max_steps=steps, log_every=20, device="cpu",
        eval=dataclasses.replace(cfg.train.eval, every=0),
        precision=dataclasses.replace(cfg.train.precision, **precision),
    )  # fmt: skip
    result = train(cfg.model, tcfg, prepared.shard_dir, out)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return result, [r for r in records if "loss" in r]


@pytest.fixture(scope="module")
def fp32_loss(prepared, tmp_path_factory):
    torch.set_num_threads(1)
    return _run(prepared, tmp_path_factory.mktemp("fp32"), STEPS)[0].final_eval.loss


@pytest.mark.parametrize(
    "precision,cast_module",
    [("bf16", False), ("fp16", False), ("fp16", True), ("fp8", False)],
    ids=["bf16-autocast", "fp16-loss-scaled", "fp16-cast-module", "fp8-simulated"],
)
def test_precision_trains_like_fp32(prepared, tmp_path, fp32_loss, precision, cast_module):
    result, logs = _run(prepared, tmp_path, STEPS, dtype=precision, cast_module=cast_module)
    assert result.precision.startswith(precision)
    assert logs[-1]["loss"] < logs[0]["loss"] - 0.5  # it learned
    assert abs(result.final_eval.loss - fp32_loss) <= TOLERANCE[precision]
    assert all(r["mfu"] > 0 and r["tokens_per_s"] > 0 for r in logs)
    if precision == "fp16":
        assert all("loss_scale" in r for r in logs)
    # master weights stay fp32 whatever the compute precision
    saved = torch.load(result.checkpoint / "optimizer.pt", weights_only=True)
    assert all(
        v.dtype == torch.float32
        for s in saved["state"].values()
        for k, v in s.items()
        if k != "step"
    )


def test_loss_scaler_backs_off_on_overflow_and_grows_after_clean_steps():
    scaler = DynamicLossScaler("cpu", init_scale=1024.0, growth_interval=3)
    scaler.update(torch.tensor(True))
    assert float(scaler.scale) == 512.0
    for _ in range(3):
        scaler.update(torch.tensor(False))
    assert float(scaler.scale) == 1024.0
    grads = [torch.full((3,), 1024.0)]
    scaler.unscale_(grads)
    assert torch.equal(grads[0], torch.ones(3))


def test_fp16_overflow_skips_the_step_and_halves_the_scale(prepared, tmp_path):
    """With an absurd initial scale the first steps overflow; they are skipped, not applied."""
    import lmforge.train.precision as precision_module

    class HugeScale(DynamicLossScaler):
        def __init__(self, device):
            super().__init__(device, init_scale=2.0**24)

    original = precision_module.DynamicLossScaler
    precision_module.DynamicLossScaler = HugeScale
    try:
        result, logs = _run(prepared, tmp_path, 20, dtype="fp16")
    finally:
        precision_module.DynamicLossScaler = original
    assert result.skipped_steps > 0
    assert logs[-1]["skipped_steps"] == result.skipped_steps
    assert logs[-1]["loss_scale"] < 2.0**24
    assert logs[-1]["loss"] < 5.5  # it trained once the scale came down (untrained: ~5.9)


def test_fp8_linear_quantizes_within_e4m3_precision():
    torch.manual_seed(0)
    linear = Linear(64, 32)
    fp8 = Float8Linear(linear)
    x = torch.randn(16, 64, requires_grad=True)
    y = fp8(x)
    exact = x @ linear.weight.T
    # E4M3 keeps 3 mantissa bits: each operand is off by at most 2^-4 relative
    assert (y - exact).abs().max() < 0.15 * exact.abs().max()
    y.sum().backward()
    assert x.grad.shape == x.shape and linear.weight.grad.shape == linear.weight.shape
    assert torch.allclose(x.grad, torch.ones(16, 32) @ linear.weight, rtol=0.1, atol=0.1)


def test_fp8_delayed_scaling_uses_the_amax_history():
    linear = Linear(16, 16)
    fp8 = Float8Linear(linear, history=4)
    fp8(torch.full((2, 16), 3.0)).sum().backward()
    fp8.update_scales()
    assert float(fp8.amax_history[0, 0]) == 3.0
    # scale: the largest power of two with 3 · scale ≤ 448 (E4M3's max) is 128
    assert float(fp8.scales[0]) == 128.0
    # a later, larger input saturates at the delayed scale instead of overflowing to NaN
    out = fp8(torch.full((2, 16), 100.0))
    assert torch.isfinite(out).all()
    q = (torch.full((1,), 100.0) * fp8.scales[0]).clamp(max=448).to(E4M3)
    assert float(q.float()) == 448.0


def test_fp8_converts_block_linears_and_keeps_checkpoint_keys():
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2))
    keys = set(model.state_dict())
    layers = convert_to_float8(model)
    assert len(layers) == 2 * 7  # q, k, v, o, gate, up, down per block
    assert type(model.output) is Linear  # the head keeps the surrounding precision
    assert set(model.state_dict()) == keys


def test_bad_precision_settings_are_clear_errors():
    with pytest.raises(LmforgeError, match="unknown precision 'fp4'"):
        make_precision("fp4", torch.device("cpu"))
    with pytest.raises(LmforgeError, match="cast_module needs precision bf16 or fp16"):
        make_precision("fp32", torch.device("cpu"), cast_module=True)


@pytest.mark.parametrize(
    "bf16_speedup,profile,expected",
    [
        (2.1, None, "bf16"),
        (0.3, None, "fp32"),
        (2.1, "avx512-bf16", "bf16"),
        (2.1, "avx512", "fp32"),  # a profile without native bf16 never picks it
        (2.1, "avx2", "fp32"),
        (2.1, "neon", "fp32"),
    ],
)
def test_auto_picks_bf16_only_where_it_is_measured_fast(
    monkeypatch, tmp_path, bf16_speedup, profile, expected
):
    import lmforge.device.peak as peak_module

    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path))
    if profile:
        monkeypatch.setenv("LMFORGE_CPU_PROFILE", profile)
    else:  # the measurement alone decides, whatever profile the suite runs under
        monkeypatch.delenv("LMFORGE_CPU_PROFILE", raising=False)
    peaks = {"fp32": 1e11, "bf16": bf16_speedup * 1e11}
    monkeypatch.setattr(peak_module, "measure_matmul_flops", lambda device, dtype: peaks[dtype])
    assert make_precision("auto", torch.device("cpu")).name == expected
