"""LoRA: exact at step 0, exact merges, PEFT's files both ways, checkpoints that load merged."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # set before transformers is imported: no network

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

from lmforge.errors import LmforgeError
from lmforge.model import ModelConfig, Transformer
from lmforge.model.hf import export_hf
from lmforge.model.lora import (
    LoraLinear,
    LoraSpec,
    apply_lora,
    count_trainable,
    lora_modules,
    merge_lora,
    set_merged,
)
from lmforge.model.peft import ADAPTER_CONFIG, ADAPTER_WEIGHTS, load_adapter, save_adapter
from lmforge.tokenizer import train_bpe
from lmforge.train.checkpoint import load_checkpoint, save_checkpoint

SPEC = LoraSpec(r=4, alpha=8, targets=("q", "k", "v", "o", "gate", "up", "down"))


def _model(**overrides) -> Transformer:
    torch.manual_seed(0)
    config = dict(vocab_size=320, d_model=64, n_layers=2, n_heads=4, max_seq_len=64)
    return Transformer(ModelConfig(**{**config, **overrides})).eval()


def _trained(model: Transformer) -> Transformer:
    """Adapters with non-zero B, as after some training."""
    torch.manual_seed(1)
    with torch.no_grad():
        for _, module in lora_modules(model):
            module.lora_B.normal_(std=0.05)
    return model


IDS = torch.randint(0, 320, (2, 17), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(["def f(x):\n    return x\n"] * 20, vocab_size=300, workers=1)


def test_step_zero_is_the_base_model_and_only_adapters_train():
    model = _model()
    base = model(IDS)
    apply_lora(model, SPEC)
    assert torch.equal(model(IDS), base)  # B starts at zero
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    assert len(trainable) == 2 * 7 * 2  # A and B on 7 projections in 2 layers
    loss = model(IDS).logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)
    assert all(p.grad is not None for n, p in model.named_parameters() if n in trainable)


def test_scaling_and_rslora():
    assert LoraSpec(r=8, alpha=16).scaling == 2.0
    assert LoraSpec(r=16, alpha=16, rslora=True).scaling == 4.0


def test_merge_and_unmerge_are_exact_up_to_rounding():
    model = _trained(apply_lora(_model(), SPEC))
    before = {n: p.clone() for n, p in model.named_parameters()}
    out = model(IDS)
    set_merged(model, True)
    assert torch.allclose(model(IDS), out, atol=1e-5)
    set_merged(model, False)
    for n, p in model.named_parameters():
        assert torch.allclose(p, before[n], atol=1e-6), n
    merged = merge_lora(model)
    assert not any(isinstance(m, LoraLinear) for m in merged.modules())
    assert set(merged.state_dict()) == set(_model().state_dict())
    assert torch.allclose(merged(IDS), out, atol=1e-5)


def test_spec_parsing_and_refusals():
    spec = LoraSpec.parse("r=8,alpha=16,dropout=0.05,targets=q,k,v_proj,rslora=true")
    assert spec == LoraSpec(r=8, alpha=16, dropout=0.05, targets=("q", "k", "v"), rslora=True)
    assert LoraSpec.parse("") == LoraSpec()
    assert LoraSpec().targets == ("q", "k", "v", "o")
    for bad, words in [
        ("r=0", "rank"),
        ("rank=4", "unknown LoRA setting"),
        ("targets=q,emb", "unknown LoRA target"),
        ("r=x", "bad LoRA setting"),
        ("dropout=1", "dropout"),
    ]:
        with pytest.raises(LmforgeError, match=words):
            LoraSpec.parse(bad)


def test_trainable_parameters_under_one_percent_at_134m():
    with torch.device("meta"):
        model = Transformer(
            ModelConfig(vocab_size=32000, d_model=768, n_layers=12, n_heads=12, max_seq_len=512)
        )
        apply_lora(model, LoraSpec())  # the defaults: r=8 on the attention projections
    trainable, total = count_trainable(model)
    assert total > 100e6
    assert trainable / total < 0.01


def test_peft_loads_an_lmforge_adapter_and_merges_the_same(tokenizer, tmp_path):
    model = _trained(apply_lora(_model(), SPEC))
    folder = save_adapter(model, tmp_path / "adapter", base_model="hf")
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    keys = load_file(folder / ADAPTER_WEIGHTS)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in keys

    out = export_hf(_model(), tokenizer, tmp_path / "hf")  # the same base weights (same seed)
    hf = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    peft_model = PeftModel.from_pretrained(hf, folder).eval()
    with torch.no_grad():
        ours = model(IDS)
        theirs = peft_model(IDS).logits
        assert (ours - theirs).abs().max() < 1e-4
        merged_theirs = peft_model.merge_and_unload().state_dict()
    merged_ours = merge_lora(model)
    for name, weight in merged_ours.state_dict().items():
        if name.endswith("q_proj.weight") and name.startswith("layers.1"):
            assert torch.allclose(weight, merged_theirs["model.layers.1.self_attn.q_proj.weight"])
        if name.endswith("down_proj.weight") and name.startswith("layers.0"):
            assert torch.allclose(weight, merged_theirs["model.layers.0.mlp.down_proj.weight"])


def test_a_peft_made_adapter_loads_into_lmforge(tokenizer, tmp_path):
    model = _model()
    out = export_hf(model, tokenizer, tmp_path / "hf")
    hf = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)
    config = LoraConfig(r=2, lora_alpha=6, target_modules=["q_proj", "v_proj", "up_proj"])
    peft_model = get_peft_model(hf, config)
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    peft_model.save_pretrained(tmp_path / "theirs")
    spec = load_adapter(model, tmp_path / "theirs")
    assert spec.targets == (
        "q",
        "v",
        "up",
    )  # in TARGETS order, whatever the file's and spec.scaling == 3.0
    with torch.no_grad():
        assert (model(IDS) - peft_model.eval()(IDS).logits).abs().max() < 1e-4


def test_bad_adapters_are_refused_without_changing_the_model(tmp_path):
    model = _trained(apply_lora(_model(), SPEC))
    folder = save_adapter(model, tmp_path / "a")
    config = json.loads((folder / ADAPTER_CONFIG).read_text())

    def edited(**changes):
        (folder / ADAPTER_CONFIG).write_text(json.dumps({**config, **changes}))
        return folder

    target = _model()
    for changes, words in [
        ({"use_dora": True}, "use_dora"),
        ({"bias": "all"}, "bias"),
        ({"rank_pattern": {"q_proj": 2}}, "rank_pattern"),
        ({"peft_type": "IA3"}, "LoRA only"),
        ({"target_modules": ".*proj"}, "target_modules"),
        ({"r": 8}, "shape"),
    ]:
        with pytest.raises(LmforgeError, match=words):
            load_adapter(target, edited(**changes))
        assert not any(True for _ in lora_modules(target))
    with pytest.raises(LmforgeError, match="no adapter_config.json"):
        load_adapter(target, tmp_path)
    with pytest.raises(LmforgeError, match="no LoRA adapters"):
        save_adapter(_model(), tmp_path / "b")


def test_a_lora_checkpoint_loads_merged_and_an_adapter_loads_on_top(tokenizer, tmp_path):
    model = _trained(apply_lora(_model(), SPEC))
    expected = model(IDS)
    tok_dir = tmp_path / "tok"
    tokenizer.save(tok_dir)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    path = save_checkpoint(tmp_path / "ckpt", 3, model, optimizer, {}, {}, {}, tok_dir)
    assert json.loads((path / "config.json").read_text())["lora"]["r"] == 4
    loaded, _ = load_checkpoint(path)
    assert not any(isinstance(m, LoraLinear) for m in loaded.modules())
    assert torch.allclose(loaded(IDS), expected, atol=1e-5)

    base = _model()
    plain = save_checkpoint(
        tmp_path / "base", 1, base, torch.optim.AdamW(base.parameters()), {}, {}, {}, tok_dir
    )
    adapter = save_adapter(model, tmp_path / "adapter")
    with_adapter, _ = load_checkpoint(plain, adapter=adapter)
    assert torch.allclose(with_adapter(IDS), expected, atol=1e-5)
