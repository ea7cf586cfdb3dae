"""Quantized checkpoints: written atomically, loaded by everything that decodes, refused with one
line when their tensors disagree with their config; an int8 model's greedy tokens equal those of
the same weights dequantized into a float model."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.infer.weight_layouts import load_for_decode
from lmforge.model import ModelConfig, Transformer
from lmforge.quant.checkpoint import quantize_checkpoint, read_quantization
from lmforge.quant.linear import QuantizedLinear
from lmforge.tokenizer import Tokenizer
from lmforge.train.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, d_model=64, n_layers=2, n_heads=4, max_seq_len=64
    )
    torch.manual_seed(0)
    model = Transformer(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    root = tmp_path_factory.mktemp("ckpt")
    return save_checkpoint(root, 1, model, optimizer, {}, {}, {}, prepared.tokenizer_dir)


@pytest.fixture(scope="module")
def int8(checkpoint, tmp_path_factory):
    return quantize_checkpoint(checkpoint, tmp_path_factory.mktemp("q") / "int8", "int8")


def dequantized_copy(model: Transformer) -> Transformer:
    """A float Transformer holding the quantized model's weights, dequantized."""
    plain = Transformer(model.config)
    state = {}
    for name, module in model.named_modules():
        if isinstance(module, QuantizedLinear):
            state[f"{name}.weight"] = module.quantized_weight().dequantize()
    for name, tensor in model.state_dict().items():
        if name.rsplit(".", 1)[-1] not in ("qweight", "scales", "zeros"):
            state[name] = tensor
    plain.load_state_dict(state)
    return plain.eval()


def test_int8_checkpoint_holds_codes_and_says_how(int8, checkpoint) -> None:
    block = read_quantization(int8)
    assert block["scheme"] == "int8" and block["method"] == "rtn"
    assert len(block["modules"]) == 2 * 7 and "output" not in block["modules"]
    tensors = load_file(int8 / "model.safetensors")
    assert tensors["layers.0.attn.q_proj.qweight"].dtype == torch.int8
    assert tensors["output.weight"].dtype == torch.float32
    assert (int8 / "tokenizer").is_dir() and not list(int8.parent.glob(".*.tmp"))
    assert read_quantization(checkpoint) is None


def test_engine_greedy_tokens_equal_the_dequantized_float_model(int8) -> None:
    model, tokenizer = load_for_decode(int8)
    assert isinstance(model.layers[0].mlp.down_proj, QuantizedLinear)
    plain = dequantized_copy(model)
    prompts = [tokenizer.encode(p) for p in ("def main(", "import os\n", "x = [")]
    params = SamplingParams(max_tokens=12, temperature=0)
    got, want = (
        [c.token_ids for c in Engine(m, tokenizer, max_batch_size=2).generate(prompts, params)]
        for m in (model, plain)
    )
    assert got == want and all(len(ids) == 12 for ids in got)


def test_generate_serves_an_int4_awq_checkpoint(checkpoint, tmp_path, capsys) -> None:
    calibration = torch.randint(0, 300, (4, 32), generator=torch.Generator().manual_seed(0))
    out = quantize_checkpoint(checkpoint, tmp_path / "int4", "int4", 64, "awq", calibration)
    assert read_quantization(out)["group_size"] == 64
    # groups of 128 do not divide d_model 64: the largest size that divides every matrix is used
    out = quantize_checkpoint(checkpoint, tmp_path / "g128", "int4", 128)
    assert read_quantization(out)["group_size"] == 64
    args = ["--prompt", "def f(", "--temperature", "0", "--max-new-tokens", "5"]
    assert main(["generate", "--checkpoint", str(out), *args]) == 0
    assert capsys.readouterr().out.startswith("def f(")


def test_tensors_that_disagree_with_the_config_are_refused(int8, tmp_path) -> None:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(int8, bad)
    config = json.loads((bad / "config.json").read_text())
    config["quantization"]["scheme"] = "int4"
    config["quantization"]["group_size"] = 32
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(LmforgeError, match="does not match its int4 config.json"):
        load_for_decode(bad)
    config["quantization"] |= {"scheme": "int8", "group_size": None}
    (bad / "config.json").write_text(json.dumps(config))
    tensors = load_file(bad / "model.safetensors")
    tensors["layers.1.attn.v_proj.qweight"] = tensors["layers.1.attn.v_proj.qweight"].view(
        torch.uint8
    )
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(LmforgeError, match="v_proj.qweight holds U8 codes but config.json"):
        load_for_decode(bad)


def test_quantizing_twice_or_with_bad_options_is_refused(checkpoint, int8, tmp_path) -> None:
    with pytest.raises(LmforgeError, match="already quantized"):
        quantize_checkpoint(int8, tmp_path / "again", "int8")
    with pytest.raises(LmforgeError, match="needs calibration data"):
        quantize_checkpoint(checkpoint, tmp_path / "g", "int4", 64, "gptq")
    with pytest.raises(LmforgeError, match="group size 48"):
        quantize_checkpoint(checkpoint, tmp_path / "g", "int4", 48)
    assert not (tmp_path / "g").exists()


def test_lmforge_load_returns_a_quantized_checkpoint_as_saved(int8) -> None:
    import lmforge

    model, tokenizer = lmforge.load(str(int8))
    assert isinstance(model.layers[0].attn.q_proj, QuantizedLinear)
    ids = torch.tensor([tokenizer.encode_ordinary("def f():")])
    assert model(ids).shape == (1, ids.shape[1], model.config.vocab_size)
