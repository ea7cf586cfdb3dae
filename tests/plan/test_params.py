"""Planned parameter counts equal the real model's numel, and the published counts, exactly."""

import dataclasses

import pytest
import torch

from lmforge.config import PRESETS
from lmforge.model import ModelConfig, Transformer
from lmforge.plan.params import param_counts
from lmforge.plan.shapes import from_model_config
from lmforge.planner_inputs import resolve, shape_names

PUBLISHED = {
    "gpt2-124m": 124_439_808,
    "llama2-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "mixtral-8x7b": 46_702_792_704,
}


def meta_numel(cfg: ModelConfig) -> int:
    with torch.device("meta"):
        model = Transformer(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_counts_its_model_exactly(name):
    cfg = PRESETS[name]().model
    assert param_counts(from_model_config(name, cfg))["total"] == meta_numel(cfg)


@pytest.mark.parametrize(
    "change",
    [
        {"n_kv_heads": 2},
        {"n_kv_heads": 1, "tie_embeddings": True},
        {"n_experts": 4, "experts_per_token": 2},
        {"n_experts": 8, "experts_per_token": 1, "n_kv_heads": 2, "d_ff": 96},
        {"n_experts": 8, "experts_per_token": 2, "moe_expert_d_ff": 48, "moe_shared_experts": 2},
    ],
)
def test_gqa_moe_and_tied_variants_count_exactly(change):
    cfg = dataclasses.replace(PRESETS["tiny"]().model, **change)
    assert param_counts(from_model_config("v", cfg))["total"] == meta_numel(cfg)


def test_fine_grained_and_shared_experts_count_their_active_parameters():
    cfg = dataclasses.replace(
        PRESETS["tiny"]().model, n_experts=8, experts_per_token=2, moe_expert_d_ff=48,
        moe_shared_experts=1,
    )  # fmt: skip
    counts = param_counts(from_model_config("fine", cfg))
    per_expert = 3 * cfg.d_model * 48
    assert counts["total"] - counts["active"] == cfg.n_layers * 6 * per_expert  # 6 idle of 8


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_named_shapes_equal_published_counts(name):
    assert param_counts(resolve(name))["total"] == PUBLISHED[name]


def test_mixtral_active_parameters():
    counts = param_counts(resolve("mixtral-8x7b"))
    assert counts["active"] == 12_879_925_248  # 2 of 8 experts: ~12.9B
    assert (
        counts["mlp"]
        + counts["router"]
        + counts["attention"]
        + counts["embeddings"] * 2
        + (counts["norms"])
        == counts["total"]
    )


def test_lmforge_gpt2_preset_plans_as_what_it_trains():
    shape = resolve("lmforge-gpt2-124m")
    assert shape.family == "llama"
    assert param_counts(shape)["total"] == meta_numel(PRESETS["gpt2-124m"]().model)
    assert "lmforge-gpt2-124m" in shape_names()


def test_counts_match_hugging_face_models():
    import transformers  # the dev extra installs it (through the hf extra)

    hf = {
        "gpt2-124m": transformers.GPT2Config(),
        "llama2-7b": transformers.LlamaConfig(
            vocab_size=32000, hidden_size=4096, intermediate_size=11008,
            num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        ),
        "llama3-70b": transformers.LlamaConfig(
            vocab_size=128256, hidden_size=8192, intermediate_size=28672,
            num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
        ),
        "mixtral-8x7b": transformers.MixtralConfig(),
    }  # fmt: skip
    for name, config in hf.items():
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name], name
