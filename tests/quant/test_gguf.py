"""GGUF export: llama.cpp's names, keys and RoPE layout, read back through `gguf`'s own reader
and dequantizer, tied to lmforge's weights, tokenizer and forward pass."""

import json
import sys

import gguf
import numpy as np
import pytest
import torch

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig, Transformer
from lmforge.model.hf import to_hf_state_dict
from lmforge.model.rope import apply_rope, rope_tables
from lmforge.quant.checkpoint import quantize_checkpoint
from lmforge.quant.gguf import (
    TYPES,
    export_gguf,
    gguf_name,
    gguf_tensors,
    lmforge_tensors,
    permute_qk,
    read_gguf,
    unpermute_qk,
)
from lmforge.tokenizer import train_bpe
from lmforge.tokenizer.hf_json import to_json
from lmforge.tokenizer.pretokenize import GPT4_PATTERN
from lmforge.train.checkpoint import save_checkpoint

EOT = "<|endoftext|>"
CORPUS = [
    "def f(x):\n    return x * 2  # café naïve 日本語 😀\n",
    "The quick brown fox jumps over the lazy dog.\n",
]
# d_ff=80 leaves ffn_down's rows (80 values) off the 32-value block: the f16 fallback.
BASE = dict(vocab_size=320, d_model=64, n_layers=2, n_heads=4, d_ff=80, max_seq_len=32)
CONFIGS = {
    "gqa": dict(n_kv_heads=2, rope_theta=500.0),
    "tied": dict(tie_embeddings=True, norm_eps=1e-6),
}
Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(CORPUS * 10, vocab_size=300, special_tokens=[EOT, "<|pad|>"], workers=1)


def _model(name: str) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**BASE, **CONFIGS[name])).eval()
    with torch.no_grad():  # gains away from 1, so a norm written as ones would be caught
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def models():
    return {name: _model(name) for name in CONFIGS}


@pytest.fixture(scope="module")
def files(models, tokenizer, tmp_path_factory):
    """{(config, type): (export result, metadata, tensors read back)}."""
    root = tmp_path_factory.mktemp("gguf")
    found = {}
    for key in [("gqa", t) for t in TYPES] + [("tied", "f16")]:
        result = export_gguf(models[key[0]], tokenizer, root / f"{key[0]}-{key[1]}.gguf", key[1])
        found[key] = (result, *read_gguf(result.path))
    return found


def _types(path) -> dict[str, Q]:
    return {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}


# -- names and the RoPE permutation -------------------------------------------------------


@pytest.mark.parametrize("config", list(CONFIGS))
def test_names_are_those_gguf_maps_the_hf_names_to(models, config):
    model = models[config]
    names = gguf.TensorNameMap(gguf.MODEL_ARCH.LLAMA, model.config.n_layers)
    hf = to_hf_state_dict(model)
    ours = [n for n in model.state_dict() if not (n == "output.weight" and config == "tied")]
    assert len(ours) == len(hf)
    for name, hf_name in zip(ours, hf, strict=True):
        assert names.get_name(hf_name, try_suffixes=(".weight",)) == gguf_name(name)
    assert ("output.weight" in gguf_tensors(model)) == (config == "gqa")


def _interleaved_rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's "normal" RoPE on x (heads, T, head_dim): pair (2i, 2i+1) rotated by
    position · theta^(-2i/head_dim)."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angles = torch.outer(torch.arange(x.shape[-2], dtype=torch.float64), inv_freq)
    cos, sin = angles.cos().float(), angles.sin().float()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


def _scores(h, wq, wk, n_heads, n_kv, rope) -> torch.Tensor:
    t = h.shape[0]
    q = rope((h @ wq.T).view(t, n_heads, -1).transpose(0, 1))
    k = rope((h @ wk.T).view(t, n_kv, -1).transpose(0, 1))
    return q @ k.repeat_interleave(n_heads // n_kv, dim=0).transpose(1, 2)


@pytest.mark.parametrize(("n_heads", "n_kv"), [(4, 4), (4, 2), (6, 1)])
def test_permuted_qk_under_interleaved_rope_give_lmforge_attention_scores(n_heads, n_kv):
    torch.manual_seed(1)
    head_dim, d_model, t, theta = 16, 48, 24, 10000.0
    wq = torch.randn(n_heads * head_dim, d_model) / d_model**0.5
    wk = torch.randn(n_kv * head_dim, d_model) / d_model**0.5
    h = torch.randn(t, d_model)
    cos, sin = rope_tables(head_dim, t, theta)
    ours = _scores(h, wq, wk, n_heads, n_kv, lambda x: apply_rope(x, cos, sin))

    def llama_cpp(x):
        return _interleaved_rope(x, theta)

    permuted = _scores(h, permute_qk(wq, n_heads), permute_qk(wk, n_kv), n_heads, n_kv, llama_cpp)
    torch.testing.assert_close(permuted, ours, atol=1e-5, rtol=0)
    unpermuted = _scores(h, wq, wk, n_heads, n_kv, llama_cpp)
    assert (unpermuted - ours).abs().max() > 0.1  # the check can tell the layouts apart
    assert torch.equal(unpermute_qk(permute_qk(wk, n_kv), n_kv), wk)
    # llama.cpp's own formula: reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2)
    reference = wq.numpy().reshape(n_heads, 2, head_dim // 2, d_model).swapaxes(1, 2)
    assert np.array_equal(permute_qk(wq, n_heads).numpy(), reference.reshape(wq.shape))


# -- metadata and tokenizer ---------------------------------------------------------------


def test_llama_keys_are_the_model_config(files, models):
    _, metadata, _ = files[("gqa", "q8_0")]
    c = models["gqa"].config
    expected = {
        "general.architecture": "llama",
        "general.name": "gqa-q8_0",
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q8_0),
        "llama.context_length": c.max_seq_len,
        "llama.embedding_length": c.d_model,
        "llama.block_count": c.n_layers,
        "llama.feed_forward_length": 80,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.rope.dimension_count": 16,
        "llama.vocab_size": 320,
    }
    assert {k: metadata[k] for k in expected} == expected
    assert metadata["llama.rope.freq_base"] == 500.0
    assert metadata["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5, rel=1e-6)
    assert files[("gqa", "f16")][1]["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_F16)
    assert files[("gqa", "q4_0")][1]["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q4_0)


def test_tokens_and_merges_are_the_hf_exports(files, tokenizer):
    _, metadata, _ = files[("gqa", "f16")]
    hf = to_json(tokenizer)["model"]
    tokens = metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == 320  # the model's vocabulary, past the tokenizer's
    assert {t: i for i, t in enumerate(tokens[: tokenizer.vocab_size])} == hf["vocab"]
    assert metadata["tokenizer.ggml.merges"] == hf["merges"]
    assert tokens[tokenizer.vocab_size :] == [f"[PAD{i}]" for i in range(tokenizer.vocab_size, 320)]
    kinds = gguf.TokenType
    types = metadata["tokenizer.ggml.token_type"]
    for i, kind in enumerate(types):
        if i >= tokenizer.vocab_size:
            assert kind == kinds.UNUSED
        elif i in tokenizer.special_tokens.values():
            assert kind == kinds.CONTROL
        else:
            assert kind == kinds.NORMAL
    assert metadata["tokenizer.ggml.model"] == "gpt2"
    assert metadata["tokenizer.ggml.pre"] == "gpt-2"
    assert metadata["tokenizer.ggml.bos_token_id"] == tokenizer.eot_id == tokens.index(EOT)
    assert metadata["tokenizer.ggml.eos_token_id"] == tokenizer.eot_id
    assert metadata["tokenizer.ggml.add_bos_token"] is True
    assert "<|endoftext|>" in metadata["tokenizer.chat_template"]


def test_gpt4_pattern_is_llama_bpe_and_a_custom_one_is_refused(models, tmp_path):
    tok = train_bpe(CORPUS, vocab_size=270, special_tokens=[EOT], pattern=GPT4_PATTERN, workers=1)
    metadata, _ = read_gguf(export_gguf(models["tied"], tok, tmp_path / "a.gguf").path)
    assert metadata["tokenizer.ggml.pre"] == "llama-bpe"
    custom = train_bpe(CORPUS, vocab_size=270, special_tokens=[EOT], pattern=r"\S+|\s+", workers=1)
    with pytest.raises(LmforgeError, match="custom pattern"):
        export_gguf(models["tied"], custom, tmp_path / "b.gguf")
    assert not (tmp_path / "b.gguf").exists()


# -- tensors ------------------------------------------------------------------------------


@pytest.mark.parametrize("config", list(CONFIGS))
def test_f16_reads_back_as_the_permuted_weights_rounded_to_f16(files, models, config):
    result, _, tensors = files[(config, "f16")]
    model = models[config]
    expected = gguf_tensors(model)
    assert tensors.keys() == expected.keys() and result.fallbacks == []
    types = _types(result.path)
    for name, tensor in expected.items():
        assert types[name] == (Q.F16 if tensor.dim() == 2 else Q.F32), name
        assert torch.equal(tensors[name], tensor.half().float() if tensor.dim() == 2 else tensor)
    back = lmforge_tensors(tensors, model.config)
    for name, tensor in model.state_dict().items():
        rounded = tensor.half().float() if tensor.dim() == 2 else tensor
        assert torch.equal(back[name], rounded), name


def _step_bound(weight: torch.Tensor, file_type: str) -> torch.Tensor:
    """Per value, the largest error the scheme allows: q8_0 rounds to half its step
    max|block|/127, q4_0 (step max|block|/8) may clip the largest opposite-sign value by a whole
    step; both store the step as f16, which each of up to 127 (8) steps carries."""
    blocks = weight.reshape(-1, 32).double()
    levels = 127 if file_type == "q8_0" else 8
    step = blocks.abs().amax(dim=1, keepdim=True) / levels
    rounding = (step.half().double() - step).abs() * levels
    bound = (step / 2 if file_type == "q8_0" else step) + rounding + 1e-7
    return bound.expand_as(blocks).reshape(weight.shape)


@pytest.mark.parametrize("file_type", ["q8_0", "q4_0"])
def test_quantized_read_back_is_gguf_dequantize_of_its_quantize_within_the_step(
    files, models, file_type
):
    result, _, tensors = files[("gqa", file_type)]
    model = models["gqa"]
    expected = gguf_tensors(model)
    fallbacks = [f"blk.{i}.ffn_down.weight" for i in range(2)]
    assert result.fallbacks == fallbacks
    qtype = Q.Q8_0 if file_type == "q8_0" else Q.Q4_0
    types = _types(result.path)
    for name, weight in expected.items():
        got = tensors[name]
        if weight.dim() == 1:
            assert types[name] == Q.F32 and torch.equal(got, weight)
        elif name in fallbacks:
            assert types[name] == Q.F16 and torch.equal(got, weight.half().float())
        else:
            assert types[name] == qtype, name
            reference = gguf.quants.dequantize(gguf.quants.quantize(weight.numpy(), qtype), qtype)
            assert np.array_equal(got.numpy(), reference), name
            error = (got.double() - weight.double()).abs()
            assert (error <= _step_bound(weight, file_type)).all(), name
            assert error.max() > 0  # it is quantized, not a copy
    back = lmforge_tensors(tensors, model.config)
    for name, weight in model.state_dict().items():
        if weight.dim() == 2 and gguf_name(name) not in fallbacks:
            error = (back[name].double() - weight.double()).abs()
            assert (error <= _step_bound(weight, file_type)).all(), name


def _rms(x, gain, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def _llama_cpp_logits(metadata, t, ids) -> torch.Tensor:
    """The logits llama.cpp's "llama" graph computes from the file: interleaved RoPE, query
    head h reading KV head h // (n_head / n_head_kv), the head falling back to token_embd."""
    n_head, n_kv = metadata["llama.attention.head_count"], metadata["llama.attention.head_count_kv"]
    eps, theta = (
        metadata["llama.attention.layer_norm_rms_epsilon"],
        metadata["llama.rope.freq_base"],
    )
    n = len(ids)
    x = t["token_embd.weight"][ids]
    mask = torch.full((n, n), float("-inf")).triu(1)
    for i in range(metadata["llama.block_count"]):
        b = {k.split(".")[2]: v for k, v in t.items() if k.startswith(f"blk.{i}.")}
        h = _rms(x, b["attn_norm"], eps)
        q = _interleaved_rope((h @ b["attn_q"].T).view(n, n_head, -1).transpose(0, 1), theta)
        k = _interleaved_rope((h @ b["attn_k"].T).view(n, n_kv, -1).transpose(0, 1), theta)
        v = (h @ b["attn_v"].T).view(n, n_kv, -1).transpose(0, 1)
        k, v = (z.repeat_interleave(n_head // n_kv, dim=0) for z in (k, v))
        att = torch.softmax(q @ k.transpose(1, 2) / q.shape[-1] ** 0.5 + mask, dim=-1)
        x = x + (att @ v).transpose(0, 1).reshape(n, -1) @ b["attn_output"].T
        h = _rms(x, b["ffn_norm"], eps)
        x = (
            x
            + (torch.nn.functional.silu(h @ b["ffn_gate"].T) * (h @ b["ffn_up"].T))
            @ b["ffn_down"].T
        )
    head = t.get("output.weight", t["token_embd.weight"])
    return _rms(x, t["output_norm.weight"], eps) @ head.T


@pytest.mark.parametrize("config", list(CONFIGS))
def test_llama_cpp_graph_on_the_file_gives_lmforge_logits(files, models, tokenizer, config):
    _, metadata, tensors = files[(config, "f16")]
    model = _model(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())  # the f16 file's weights
    ids = [tokenizer.eot_id, *tokenizer.encode_ordinary(CORPUS[0])][:20]
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0]
    theirs = _llama_cpp_logits(metadata, tensors, torch.tensor(ids))
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)


# -- the command --------------------------------------------------------------------------


def _checkpoint(root, tokenizer, model):
    tokenizer.save(root / "tokenizer")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return save_checkpoint(root / "run", 1, model, optimizer, {}, {}, {}, root / "tokenizer")


@pytest.fixture(scope="module")
def checkpoint(models, tokenizer, tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("ckpt"), tokenizer, models["gqa"])


def test_export_command_writes_a_q4_0_file(checkpoint, models, tmp_path, capsys):
    out = tmp_path / "model.gguf"
    args = ["export", "--checkpoint", str(checkpoint), "--format", "gguf", "--type", "q4_0"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"exported {out} (gguf, q4_0, 21 tensors)" in printed
    assert "2 tensors written f16" in printed and "blk.1.ffn_down.weight" in printed
    _, tensors = read_gguf(out)
    weight = gguf_tensors(models["gqa"])["blk.0.attn_k.weight"].numpy()
    reference = gguf.quants.dequantize(gguf.quants.quantize(weight, Q.Q4_0), Q.Q4_0)
    assert np.array_equal(tensors["blk.0.attn_k.weight"].numpy(), reference)
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]  # no temporary file left


def _one_line_error(code, capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err
    return err


def test_type_without_gguf_is_refused(checkpoint, tmp_path, capsys):
    args = [
        "export",
        "--checkpoint",
        str(checkpoint),
        "--type",
        "q8_0",
        "--out",
        str(tmp_path / "o"),
    ]
    assert "pass --format gguf" in _one_line_error(main(args), capsys)
    assert not (tmp_path / "o").exists()


def test_an_existing_out_is_refused_and_kept(checkpoint, tmp_path, capsys):
    out = tmp_path / "model.gguf"
    out.write_text("keep me")
    args = ["export", "--checkpoint", str(checkpoint), "--format", "gguf", "--out", str(out)]
    assert "already exists" in _one_line_error(main(args), capsys)
    assert out.read_text() == "keep me"


def test_moe_and_quantized_checkpoints_are_refused(checkpoint, tokenizer, tmp_path, capsys):
    torch.manual_seed(0)
    moe = Transformer(ModelConfig(**{**BASE, "d_ff": 64}, n_experts=2))
    moe_ckpt = _checkpoint(tmp_path / "moe", tokenizer, moe)
    quantized = quantize_checkpoint(checkpoint, tmp_path / "int8", "int8")
    assert json.loads((quantized / "config.json").read_text())["quantization"]["scheme"] == "int8"
    for source, message in [(moe_ckpt, "mixture of 2 experts"), (quantized, "lmforge-quantized")]:
        out = tmp_path / "x.gguf"
        args = ["export", "--checkpoint", str(source), "--format", "gguf", "--out", str(out)]
        assert message in _one_line_error(main(args), capsys)
        assert not out.exists()


def test_missing_gguf_package_names_the_extra(checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec then reports it absent
    out = tmp_path / "x.gguf"
    args = ["export", "--checkpoint", str(checkpoint), "--format", "gguf", "--out", str(out)]
    assert "pip install 'lmforge[gguf]'" in _one_line_error(main(args), capsys)
    assert not out.exists()


def test_reading_a_damaged_file_is_a_one_line_error(files, tmp_path):
    data = files[("gqa", "q8_0")][0].path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.gguf").write_text("not a gguf file " * 8)
    for name in ("cut.gguf", "text.gguf"):
        with pytest.raises(LmforgeError, match="is not a readable GGUF file"):
            read_gguf(tmp_path / name)
    with pytest.raises(LmforgeError, match="not found"):
        read_gguf(tmp_path / "absent.gguf")


def test_the_command_offers_the_types_the_exporter_writes():
    from lmforge.commands.hf import GGUF_TYPES

    assert GGUF_TYPES == TYPES
