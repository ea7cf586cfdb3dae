import dataclasses

import pytest

from lmforge.config import (
    PRESETS,
    apply_override,
    claim_run_dir,
    config_text,
    load_config,
    preset,
    save_toml,
)
from lmforge.errors import LmforgeError


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_are_consistent(name):
    cfg = preset(name)
    assert cfg.name == name
    cfg.model.validate()
    cfg.train.validate()
    assert cfg.train.seq_len <= cfg.model.max_seq_len
    assert cfg.tokenizer.vocab_size <= cfg.model.vocab_size


def test_toml_file_then_overrides_apply_in_order(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('name = "mine"\n[model]\nd_model = 96\nn_heads = 3\n[train]\nlr = 1e-3\n')
    cfg = load_config("tiny", path, ["train.lr=2e-3", "model.n_kv_heads=1", "data.path=corpus"])
    assert cfg.name == "mine"
    assert cfg.model.d_model == 96 and cfg.model.n_heads == 3 and cfg.model.n_kv_heads == 1
    assert cfg.train.lr == 2e-3
    assert cfg.data.path == "corpus"
    assert cfg.model.n_layers == preset("tiny").model.n_layers  # untouched keys keep the preset


def test_override_types_are_checked_and_ints_widen_to_float():
    cfg = preset("tiny")
    assert apply_override(cfg, "train.lr=1").train.lr == 1.0
    assert isinstance(apply_override(cfg, "train.lr=1").train.lr, float)
    assert apply_override(cfg, "model.tie_embeddings=true").model.tie_embeddings is True
    assert apply_override(cfg, "model.n_kv_heads=none").model.n_kv_heads is None
    with pytest.raises(LmforgeError, match="train.max_steps must be int"):
        apply_override(cfg, "train.max_steps=1.5")
    with pytest.raises(LmforgeError, match="section.key=value"):
        apply_override(cfg, "lr=3")


def test_unknown_keys_are_rejected_with_the_valid_ones():
    cfg = preset("tiny")
    with pytest.raises(
        LmforgeError, match=r"unknown key train\.learning_rate; valid keys: .*\blr\b"
    ):
        apply_override(cfg, "train.learning_rate=1e-3")
    with pytest.raises(LmforgeError, match="unknown section 'optim'; valid sections: model"):
        apply_override(cfg, "optim.lr=1")
    with pytest.raises(LmforgeError, match="unknown preset 'huge'"):
        preset("huge")


def test_bad_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(LmforgeError, match="not valid TOML"):
        load_config("tiny", bad)
    with pytest.raises(LmforgeError, match="does not exist"):
        load_config("tiny", tmp_path / "none.toml")


def test_saved_config_loads_back_identically(tmp_path):
    cfg = apply_override(preset("small"), "model.n_kv_heads=2")
    save_toml(cfg, tmp_path / "config.toml")
    again = load_config("tiny", tmp_path / "config.toml")
    assert dataclasses.asdict(again) == dataclasses.asdict(cfg)


def test_run_dir_refuses_another_config_unless_fresh(tmp_path):
    run = tmp_path / "run"
    claim_run_dir(preset("tiny"), run, fresh=False)
    (run / "keep.txt").write_text("x")
    claim_run_dir(preset("tiny"), run, fresh=False)  # same config: resume
    other = apply_override(preset("tiny"), "train.lr=0.5")
    with pytest.raises(LmforgeError, match="another config: pass --fresh"):
        claim_run_dir(other, run, fresh=False)
    assert (run / "keep.txt").exists()  # nothing destroyed by the refusal
    claim_run_dir(other, run, fresh=True)
    assert not (run / "keep.txt").exists()
    assert (run / "config.toml").read_text() == config_text(other)
