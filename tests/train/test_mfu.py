"""Peak FLOP/s: measured once and cached on a CPU, from the datasheet table on known GPUs."""

import json

import pytest
import torch

import lmforge.device.peak as peak_module
from lmforge.model import ModelConfig, Transformer
from lmforge.train.mfu import mfu, peak_flops


def test_cpu_peak_is_measured_once_and_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path))
    calls = []

    def fake_measure(device, dtype):
        calls.append(dtype)
        return 1.0e11

    monkeypatch.setattr(peak_module, "measure_matmul_flops", fake_measure)
    assert peak_flops("cpu", "fp32") == 1.0e11
    assert peak_flops("cpu", "fp32") == 1.0e11
    assert peak_flops("cpu", "bf16") == 1.0e11
    assert calls == ["fp32", "bf16"]
    cached = json.loads((tmp_path / "peak_flops.json").read_text())
    assert sorted(k.rsplit("|", 1)[1] for k in cached) == ["bf16", "fp32"]


def test_a_real_measurement_is_plausible():
    flops = peak_module.measure_matmul_flops("cpu", "fp32", seconds=0.2)
    assert 1e8 < flops < 1e14


@pytest.mark.parametrize(
    "name,dtype,peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12),
        ("NVIDIA H100 PCIe", "bf16", 756.0e12),
        ("NVIDIA H200", "fp8", 1978.9e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),
    ],
)
def test_known_gpus_take_the_datasheet_peak(monkeypatch, name, dtype, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda"), dtype) == peak


def test_mfu_uses_six_flops_per_weight_plus_attention():
    model = Transformer(ModelConfig(vocab_size=65, d_model=128, n_layers=4, n_heads=4))
    n = sum(p.numel() for p in model.parameters()) - 65 * 128  # the lookup table costs nothing
    per_token = 6 * n + 12 * 4 * 128 * 256
    assert model.flops_per_token(256) == per_token
    assert mfu(per_token, 1000.0, per_token * 2000.0) == 0.5
