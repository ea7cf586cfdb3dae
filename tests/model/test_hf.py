"""Hugging Face interoperability: exports that transformers loads, imports of what it writes."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # set before transformers is imported: no network

import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
)

import lmforge
from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.infer.single_prompt import generate
from lmforge.model import ModelConfig, Transformer
from lmforge.model.hf import export_hf, hf_config, import_hf, to_hf_state_dict
from lmforge.tokenizer import train_bpe
from lmforge.tokenizer.chat_template import ChatTemplate, Message
from lmforge.tokenizer.hf_json import to_json
from lmforge.tokens.encode import document_ids
from lmforge.train.checkpoint import save_checkpoint

EOT = "<|endoftext|>"
TEXT = "def f(x):\n    return x * 2  # café naïve 日本語 😀👍🏽\n\n\t\tend  \n"
CONFIGS = {
    "gqa": dict(n_kv_heads=2, rope_theta=500.0),
    "tied": dict(tie_embeddings=True, norm_eps=1e-6),
}


@pytest.fixture(scope="module")
def tokenizer():
    corpus = [TEXT, "The quick brown fox jumps over the lazy dog.\n", "Привет, мир! ∑∫√\n"]
    return train_bpe(corpus * 10, vocab_size=420, special_tokens=[EOT, "<|pad|>"], workers=1)


def _same_weights(a: Transformer, b: Transformer) -> bool:
    theirs = b.state_dict()
    return a.state_dict().keys() == theirs.keys() and all(
        torch.equal(t, theirs[name]) for name, t in a.state_dict().items()
    )


def _model(**overrides) -> Transformer:
    config = dict(vocab_size=448, d_model=64, n_layers=2, n_heads=4, max_seq_len=96)
    return Transformer(ModelConfig(**{**config, **overrides})).eval()


@pytest.fixture(scope="module", params=list(CONFIGS))
def exported(request, tokenizer, tmp_path_factory):
    """(lmforge model, its export folder, transformers' model loaded from it)."""
    torch.manual_seed(1)
    model = _model(**CONFIGS[request.param])
    out = export_hf(model, tokenizer, tmp_path_factory.mktemp("hf") / request.param)
    attention = "eager" if request.param == "gqa" else "sdpa"
    hf = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation=attention)
    return model, out, hf.eval()


def test_export_writes_a_llama_folder(exported, tokenizer):
    model, out, _ = exported
    names = {p.name for p in out.iterdir()}
    assert names == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    config = json.loads((out / "config.json").read_text())
    assert config == json.loads(json.dumps(hf_config(model.config, tokenizer.eot_id)))
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_key_value_heads"] == model.config.kv_heads
    weights = load_file(out / "model.safetensors")
    assert ("lm_head.weight" in weights) != model.config.tie_embeddings
    assert "model.layers.1.post_attention_layernorm.weight" in weights
    special = json.loads((out / "special_tokens_map.json").read_text())
    assert special == {"bos_token": EOT, "eos_token": EOT, "additional_special_tokens": ["<|pad|>"]}


def test_transformers_logits_match(exported, tokenizer):
    model, _, hf = exported
    ids = document_ids(tokenizer, TEXT)
    ids = torch.tensor([ids, ids[::-1]])
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert ours.shape == theirs.shape
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


def test_greedy_generation_gives_the_same_tokens(exported, tokenizer):
    model, _, hf = exported
    prompt = document_ids(tokenizer, "def f(")
    ours = generate(model, prompt, 24, temperature=0)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False
        )
    assert out[0, len(prompt) :].tolist() == ours


def test_transformers_tokenizer_gives_lmforge_ids(exported, tokenizer):
    _, out, _ = exported
    hf_tokenizer = AutoTokenizer.from_pretrained(out)
    for text in (TEXT, "  leading spaces\r\n\u00a0nbsp \u200b zero-width", "Ελληνικά\n\n\n"):
        assert hf_tokenizer(text)["input_ids"] == document_ids(tokenizer, text)
        plain = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert plain == tokenizer.encode_ordinary(text)
        assert hf_tokenizer.decode(plain) == text
    assert hf_tokenizer.bos_token == hf_tokenizer.eos_token == EOT
    assert hf_tokenizer.eos_token_id == tokenizer.eot_id


CONVERSATION = [
    {"role": "system", "content": "Answer in code.\n"},
    {"role": "user", "content": "café: 日本語 😀 {{ not jinja }} {% raw %}"},
    {"role": "assistant", "content": "  def f(x):\n\treturn x\n\n"},
    {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "y?"}]},
]


@pytest.mark.parametrize("specials", [[EOT, "<|im_start|>", "<|im_end|>"], [EOT], []])
def test_the_exported_chat_template_renders_lmforge_prompts(tmp_path, specials):
    chat = train_bpe([TEXT, "user assistant system\n"] * 5, 300, special_tokens=specials, workers=1)
    out = export_hf(_model(), chat, tmp_path / "hf")
    hf_tokenizer = AutoTokenizer.from_pretrained(out)
    template = ChatTemplate(chat)
    assert template.name == ("chatml" if len(specials) == 3 else "plain")
    messages = [
        Message(m["role"], m["content"] if isinstance(m["content"], str) else "And y?")
        for m in CONVERSATION
    ]
    ids = template.prompt_ids(messages)
    render = dict(add_generation_prompt=True, tokenize=False)
    text = hf_tokenizer.apply_chat_template(CONVERSATION, **render)
    assert text == chat.decode(ids)
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    developer = [{"role": "developer", "content": "Be brief."}, CONVERSATION[1]]
    text = hf_tokenizer.apply_chat_template(developer, **render)
    assert text == chat.decode(template.prompt_ids([Message("system", "Be brief."), messages[1]]))


def test_a_tokenizer_without_endoftext_adds_no_special_token(tmp_path):
    plain = train_bpe([TEXT] * 5, vocab_size=300, special_tokens=[], workers=1)
    (tmp_path / "empty").mkdir()  # an existing empty folder is filled
    out = export_hf(_model(), plain, tmp_path / "empty")
    assert json.loads((out / "config.json").read_text())["bos_token_id"] is None
    hf_tokenizer = AutoTokenizer.from_pretrained(out)
    assert hf_tokenizer(TEXT)["input_ids"] == plain.encode_ordinary(TEXT)
    assert import_hf(out)[1].fingerprint() == plain.fingerprint()


def test_round_trip_keeps_weights_and_tokenizer(exported, tokenizer):
    model, out, _ = exported
    again, again_tokenizer = import_hf(out)
    assert again.config == model.config
    assert _same_weights(again, model)
    tensors = [*again.parameters(), *again.buffers()]
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
    assert all(p.requires_grad for p in again.parameters())
    assert (again.output.weight is again.tok_embeddings.weight) == model.config.tie_embeddings
    torch.testing.assert_close(again.rope.cos, model.rope.cos, atol=0, rtol=0)
    assert again_tokenizer.fingerprint() == tokenizer.fingerprint()
    assert again_tokenizer.encode_ordinary(TEXT) == tokenizer.encode_ordinary(TEXT)


@pytest.mark.parametrize("shard", [None, "40KB"])
def test_import_of_a_folder_transformers_wrote(shard, tokenizer, tmp_path):
    config = LlamaConfig(
        vocab_size=448,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=64,
        rope_theta=1000.0,
    )
    torch.manual_seed(2)
    hf = LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    assert (tmp_path / "model.safetensors.index.json").exists() == bool(shard)
    (tmp_path / "tokenizer.json").write_text(json.dumps(to_json(tokenizer)))
    model, imported_tokenizer = import_hf(tmp_path)
    assert (model.config.n_kv_heads, model.config.d_ff, model.config.rope_theta) == (1, 96, 1e3)
    assert model.config.norm_eps == config.rms_norm_eps
    ids = torch.tensor([document_ids(tokenizer, TEXT)])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)
    assert imported_tokenizer.fingerprint() == tokenizer.fingerprint()


def test_import_reads_a_gpt2_style_vocab_and_merges(exported, tokenizer, tmp_path):
    _, out, _ = exported
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    tokenizer.save(tmp_path / "tok")
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).write_bytes((tmp_path / "tok" / name).read_bytes())
    _, imported_tokenizer = import_hf(tmp_path)
    assert imported_tokenizer.encode_ordinary(TEXT) == tokenizer.encode_ordinary(TEXT)
    assert imported_tokenizer.special_tokens == tokenizer.special_tokens


def test_cli_export_then_import_end_to_end(tokenizer, tmp_path, capsys):
    model = _model(n_kv_heads=2)
    tokenizer.save(tmp_path / "tokenizer")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints", 5, model, optimizer, {}, {}, {}, tmp_path / "tokenizer")

    hf, back = str(tmp_path / "hf"), str(tmp_path / "back")
    assert main(["export", "--checkpoint", str(run), "--format", "hf", "--out", hf]) == 0
    assert main(["import", "--from", hf, "--out", back]) == 0
    loaded, loaded_tokenizer = lmforge.load(back)
    assert loaded.config == model.config
    assert _same_weights(loaded, model)
    assert loaded_tokenizer.fingerprint() == tokenizer.fingerprint()

    capsys.readouterr()
    outputs = []
    for checkpoint in (run, tmp_path / "back"):
        args = ["--prompt", "def f(", "--max-new-tokens", "16", "--temperature", "0"]
        assert main(["generate", "--checkpoint", str(checkpoint), *args]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].startswith("def f(")

    before = sorted((tmp_path / "back").rglob("*"))
    assert main(["import", "--from", hf, "--out", back]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert sorted((tmp_path / "back").rglob("*")) == before


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "sets rope_scaling"),
        (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}), "rope_type='yarn'"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(model_type="mistral"), "model_type='mistral'"),
        (dict(attention_bias=True), "attention_bias=True"),
        (dict(num_local_experts=8), "sets num_local_experts"),
        (dict(head_dim=32), "head_dim=32"),
        (dict(num_hidden_layers=3), "tensors missing"),
        (dict(intermediate_size=100), "has shape"),
    ],
)
def test_unsupported_configs_are_refused_by_name(changes, message, exported, tmp_path):
    _, out, _ = exported
    for path in out.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    _edit_config(tmp_path, **changes)
    with pytest.raises(LmforgeError, match=message):
        import_hf(tmp_path)


def test_bad_inputs_are_clear_errors(tokenizer, tmp_path, capsys):
    code = main(["import", "--from", str(tmp_path / "nope"), "--out", str(tmp_path / "x")])
    assert code == 2 and "nope not found" in capsys.readouterr().err
    code = main(["export", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "x")])
    assert code == 2 and "no checkpoint found" in capsys.readouterr().err
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text(json.dumps(LlamaConfig().to_dict()))
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"")
    (tmp_path / "pickled" / "tokenizer.json").write_text(json.dumps(to_json(tokenizer)))
    with pytest.raises(LmforgeError, match="pytorch_model.bin, which loads through pickle"):
        import_hf(tmp_path / "pickled")
    with pytest.raises(LmforgeError, match="moe_router='sigmoid' has no MixtralForCausalLM"):
        export_hf(_model(n_experts=4, moe_router="sigmoid"), tokenizer, tmp_path / "moe")
    with pytest.raises(LmforgeError, match=f"tokenizer has {tokenizer.vocab_size} ids"):
        export_hf(_model(vocab_size=300), tokenizer, tmp_path / "small")
    assert not (tmp_path / "moe").exists() and not (tmp_path / "small").exists()


def test_state_dict_names_are_transformers_own(tokenizer):
    model = _model(n_kv_heads=1)
    hf = LlamaForCausalLM(LlamaConfig(**hf_config(model.config, tokenizer.eot_id)))
    ours = to_hf_state_dict(model)
    theirs = hf.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(ours[k].shape == theirs[k].shape for k in ours)


# -- Mixtral ------------------------------------------------------------------------------

MIXTRAL = dict(n_kv_heads=2, n_experts=4, experts_per_token=2, d_ff=96, moe_aux_loss_coef=0.02)


@pytest.fixture(scope="module")
def mixtral(tokenizer, tmp_path_factory):
    """(lmforge mixture of experts, its export folder, transformers' Mixtral loaded from it)."""
    torch.manual_seed(3)
    model = _model(**MIXTRAL)
    out = export_hf(model, tokenizer, tmp_path_factory.mktemp("mixtral") / "hf")
    hf = MixtralForCausalLM.from_pretrained(out, dtype=torch.float32, local_files_only=True)
    return model, out, hf.eval()


def test_a_mixture_exports_as_a_mixtral_folder(mixtral, tokenizer):
    model, out, hf = mixtral
    config = json.loads((out / "config.json").read_text())
    assert config == json.loads(json.dumps(hf_config(model.config, tokenizer.eot_id)))
    assert config["architectures"] == ["MixtralForCausalLM"] and config["model_type"] == "mixtral"
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (4, 2)
    assert config["router_aux_loss_coef"] == 0.02 and config["output_router_logits"] is False
    assert (hf.config.num_local_experts, hf.config.intermediate_size) == (4, 96)
    weights = load_file(out / "model.safetensors")
    experts = model.layers[1].mlp.experts
    for proj, w in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
        for n in range(4):
            name = f"model.layers.1.block_sparse_moe.experts.{n}.{w}.weight"
            assert torch.equal(weights[name], getattr(experts, proj)[n])
    router = weights["model.layers.0.block_sparse_moe.gate.weight"]
    assert torch.equal(router, model.layers[0].mlp.router.weight)


def test_transformers_mixtral_logits_match(mixtral, tokenizer):
    model, _, hf = mixtral
    ids = document_ids(tokenizer, TEXT)
    ids = torch.tensor([ids, ids[::-1]])
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert ours.shape == theirs.shape
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


def test_mixtral_round_trip_gives_identical_tensors(mixtral, tokenizer):
    model, out, _ = mixtral
    again, again_tokenizer = import_hf(out)
    assert again.config == model.config
    assert _same_weights(again, model)
    assert again.layers[0].mlp.experts.gate_proj.shape == (4, 96, 64)
    assert again_tokenizer.fingerprint() == tokenizer.fingerprint()


def test_import_of_a_mixtral_folder_transformers_wrote(tokenizer, tmp_path):
    config = MixtralConfig(
        vocab_size=448,
        hidden_size=64,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )
    torch.manual_seed(4)
    hf = MixtralForCausalLM(config).eval()
    hf.save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps(to_json(tokenizer)))
    model, _ = import_hf(tmp_path)
    c = model.config
    assert (c.n_experts, c.experts_per_token, c.d_ff, c.n_kv_heads) == (4, 2, 48, 1)
    assert (c.rope_theta, c.moe_aux_loss_coef) == (1e6, config.router_aux_loss_coef)
    ids = torch.tensor([document_ids(tokenizer, TEXT)])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)
    written = set(load_file(tmp_path / "model.safetensors"))
    assert set(to_hf_state_dict(model)) == written  # the names transformers itself writes


@pytest.mark.parametrize(
    "option, value",
    [
        ("moe_router", "sigmoid"),
        ("moe_renormalize", False),
        ("moe_capacity_factor", 1.25),
        ("moe_shared_experts", 1),
        ("moe_bias_update_rate", 0.001),
    ],
)
def test_options_mixtral_cannot_express_are_refused(option, value, tokenizer, tmp_path):
    model = _model(**{**MIXTRAL, option: value})
    with pytest.raises(LmforgeError, match=f"model.{option}={value!r} has no MixtralForCausalLM"):
        export_hf(model, tokenizer, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(sliding_window=32), "sets sliding_window"),
        (dict(router_jitter_noise=0.1), "sets router_jitter_noise"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(num_local_experts=8), "has shape"),
    ],
)
def test_unsupported_mixtral_configs_are_refused_by_name(changes, message, mixtral, tmp_path):
    _, out, _ = mixtral
    for path in out.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    _edit_config(tmp_path, **changes)
    with pytest.raises(LmforgeError, match=message):
        import_hf(tmp_path)
