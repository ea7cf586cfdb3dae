"""train.compute.kernels: "triton" fails in one line where its kernels cannot run (a CPU) and loads
none of them; under Triton's interpreter it gives the torch path's loss, gradients, state dict
and cached decoding; "torch" changes nothing; the config refuses any other choice."""

import pytest
import torch

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.kernels.triton import installed, interpreted
from lmforge.model import ModelConfig, Transformer
from lmforge.model.attention import Attention
from lmforge.model.cache import KVCache
from lmforge.model.layers import RMSNorm, SwiGLU
from lmforge.train import kernel_choice
from lmforge.train.compose import Objective, compose
from lmforge.train.config import ComputeConfig, TrainConfig
from lmforge.train.precision import make_precision

MODEL = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32)
CPU = torch.device("cpu")

if installed():
    interpreted.start()  # the child imports torch while the tests before it run


def _composed(kernels: str, fused_loss: bool = False):
    torch.manual_seed(1)
    model = Transformer(MODEL)
    objective = Objective(fused_loss)
    return compose(model, make_precision("fp32", CPU), CPU, objective=objective, kernels=kernels)


def _batch(packed: bool):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 96, (2, 20), generator=g)
    y = torch.randint(0, 96, (2, 20), generator=g)
    y[0, :3] = -100
    segments = torch.tensor([[0] * 7 + [1] * 13, [0] * 20]) if packed else None
    return x, y, segments


def run(kernels: str, packed: bool, fused_loss: bool = False) -> dict:
    """One forward and backward (the head fused into the loss, or not), and a prefill + decode
    step with a KV cache (run in the interpreter's child for "triton")."""
    composed = _composed(kernels, fused_loss)
    model = composed.master
    loss = composed.loss(*_batch(packed))
    loss.backward()
    x = _batch(packed)[0]
    cache = KVCache(MODEL.n_layers, 2, MODEL.kv_heads, MODEL.max_seq_len, MODEL.head_dim)
    with torch.no_grad():
        decoded = [model(x[:, :5], kv_cache=cache), model(x[:, 5:6], kv_cache=cache)]
    return {
        "loss": loss.detach(),
        "grads": {n: p.grad for n, p in model.named_parameters()},
        "state": model.state_dict(),
        "decoded": decoded,
        "swapped": composed.kernels,
        "classes": sorted({type(m).__name__ for m in model.modules()}),
    }


def test_triton_on_a_cpu_is_one_line_and_loads_no_kernel(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    loaded = []
    monkeypatch.setattr(kernel_choice, "load", loaded.append)
    with pytest.raises(LmforgeError) as error:
        _composed("triton")
    message = str(error.value)
    assert "\n" not in message and message.startswith("train.compute.kernels=triton cannot run")
    if installed():
        assert "run on a GPU, not on cpu" in message
    assert loaded == []


def test_training_with_triton_on_a_cpu_fails_in_one_line(prepared, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = ["train", "--preset", "tiny", "--data", str(prepared.shard_dir), "--out",
            str(tmp_path), "--device", "cpu", "--threads", "1", "--max-steps", "2",
            "--set", "train.compute.kernels=triton"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.compute.kernels=triton cannot run" in err


def test_torch_is_the_plain_model():
    composed = _composed("torch")
    classes = {type(m) for m in composed.master.modules()}
    assert composed.kernels == [] and {RMSNorm, SwiGLU, Attention} <= classes
    assert all(not type(m).__name__.startswith("Triton") for m in composed.master.modules())


@pytest.mark.skipif(not installed(), reason="needs triton (the kernels extra)")
@pytest.mark.parametrize("packed, fused_loss", [(False, False), (True, True)])
def test_triton_kernels_equal_the_torch_path(packed, fused_loss):
    want = run("torch", packed, fused_loss)
    got = interpreted.run_interpreted(
        __file__, "run", kernels="triton", packed=packed, fused_loss=fused_loss
    )
    kernels = ["rmsnorm", "swiglu", "rope", "flash_attention", "linear_cross_entropy"]
    assert got["swapped"] == kernels
    assert {"TritonRMSNorm", "TritonSwiGLU", "TritonAttention"} <= set(got["classes"])
    assert "RMSNorm" not in got["classes"] and "SwiGLU" not in got["classes"]
    torch.testing.assert_close(got["loss"], want["loss"], rtol=1e-5, atol=1e-6)
    assert got["grads"].keys() == want["grads"].keys()
    for name, grad in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], grad, rtol=1e-5, atol=1e-5, msg=name)
    for a, b in zip(got["decoded"], want["decoded"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert list(got["state"]) == list(want["state"])
    Transformer(MODEL).load_state_dict(got["state"])  # a triton run's checkpoint loads in torch


def test_the_config_takes_torch_or_triton():
    TrainConfig(max_steps=1, compute=ComputeConfig(kernels="triton")).validate()
    with pytest.raises(
        LmforgeError, match=r"train.compute.kernels is 'cuda': choose one of torch, triton"
    ):
        TrainConfig(max_steps=1, compute=ComputeConfig(kernels="cuda")).validate()
