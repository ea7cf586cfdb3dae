import dataclasses
import sys

import pytest
import tomli_w

from lmforge.config import (
    PRESETS,
    RUN_FOLDER,
    RunConfig,
    apply_dict,
    apply_override,
    config_text,
    load_config,
    preset,
    save_toml,
)
from lmforge.errors import LmforgeError
from lmforge.run_dir import RunDir
from lmforge.train.config import FLAT_KEYS

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


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
    cfg = load_config(
        "tiny", path, ["train.optimizer.lr=2e-3", "model.n_kv_heads=1", "data.path=corpus"]
    )
    assert cfg.name == "mine"
    assert cfg.model.d_model == 96 and cfg.model.n_heads == 3 and cfg.model.n_kv_heads == 1
    assert cfg.train.optimizer.lr == 2e-3
    assert cfg.data.path == "corpus"
    assert cfg.model.n_layers == preset("tiny").model.n_layers  # untouched keys keep the preset


def test_override_types_are_checked_and_ints_widen_to_float():
    cfg = preset("tiny")
    assert apply_override(cfg, "train.optimizer.lr=1").train.optimizer.lr == 1.0
    assert isinstance(apply_override(cfg, "train.optimizer.lr=1").train.optimizer.lr, float)
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
    RunDir(run, RUN_FOLDER).claim(preset("tiny"), fresh=False)
    (run / "keep.txt").write_text("x")
    RunDir(run, RUN_FOLDER).claim(preset("tiny"), fresh=False)  # same config: resume
    other = apply_override(preset("tiny"), "train.optimizer.lr=0.5")
    with pytest.raises(
        LmforgeError, match=r"another config \(train.optimizer.lr: 0.003 → 0.5\): pass --fresh"
    ):
        RunDir(run, RUN_FOLDER).claim(other, fresh=False)
    assert (run / "keep.txt").exists()  # nothing destroyed by the refusal
    RunDir(run, RUN_FOLDER).claim(other, fresh=True)
    assert not (run / "keep.txt").exists()
    assert (run / "config.toml").read_text() == config_text(other)


@pytest.mark.parametrize(
    "override,message",
    [
        ("train.optimizer.lr=-1", "train.optimizer.lr is -1.0: it must be above 0"),
        ("train.optimizer.lr=nan", "train.optimizer.lr is nan: it must be above 0"),
        (
            "train.schedule.warmup_steps=-5",
            "train.schedule.warmup_steps is -5: it must be at least 0",
        ),
        ("train.max_steps=-1", "train.max_steps is -1: it must be at least 0"),
        ("train.optimizer.beta2=1.0", r"train.optimizer.beta2 is 1.0: it must be in \[0, 1\)"),
        (
            "train.schedule.min_lr_ratio=1.5",
            r"train.schedule.min_lr_ratio is 1.5: it must be in \[0, 1\]",
        ),
        ("train.batch_size=0", "train.batch_size is 0: it must be at least 1"),
        ("data.val_fraction=1", r"data.val_fraction is 1.0: it must be in \[0, 1\)"),
        ("model.d_model=-64", "model.d_model is -64: it must be at least 1"),
        ("model.norm_eps=0", "model.norm_eps is 0.0: it must be above 0"),
        ("tokenizer.vocab_size=100", "tokenizer.vocab_size is 100: it must be at least 256"),
    ],
)
def test_out_of_range_values_are_refused_when_the_config_loads(override, message):
    with pytest.raises(LmforgeError, match=message):
        load_config("tiny", None, [override])


def test_validate_checks_data_path_device_and_context_before_any_work(tmp_path):
    with pytest.raises(LmforgeError, match="data path /no/such/corpus does not exist"):
        apply_override(preset("tiny"), "data.path=/no/such/corpus").validate()
    with pytest.raises(LmforgeError, match="unknown device 'tpu': use cpu, cuda, cuda:N, mps"):
        apply_override(preset("tiny"), "train.device=tpu").validate()
    with pytest.raises(LmforgeError, match="train.seq_len 128 exceeds model.max_seq_len 64"):
        apply_override(preset("tiny"), "train.seq_len=128").validate()
    for path in ("stdlib", str(tmp_path)):
        apply_override(preset("tiny"), f"data.path={path!r}").validate()


def test_run_dir_refusal_names_every_key_that_differs(tmp_path):
    run = tmp_path / "run"
    RunDir(run, RUN_FOLDER).claim(apply_override(preset("tiny"), "data.path='a'"), fresh=False)
    (run / "metrics.jsonl").write_text("")  # a stage ran: the folder holds a run
    other = apply_override(
        apply_override(preset("tiny"), "data.path='b'"), "train.optimizer.lr=0.5"
    )
    with pytest.raises(LmforgeError) as refused:
        RunDir(run, RUN_FOLDER).claim(other, fresh=False)
    assert "another config (data.path: a → b, train.optimizer.lr: 0.003 → 0.5)" in str(
        refused.value
    )


def test_a_run_that_finished_no_stage_gives_way_to_the_corrected_config(tmp_path, capsys):
    run = tmp_path / "run"
    RunDir(run, RUN_FOLDER).claim(apply_override(preset("tiny"), "data.path='wrong'"), fresh=False)
    (run / "data" / "pipeline").mkdir(parents=True)  # partial work of the failed run
    (run / "data" / "pipeline" / "shard_00000.jsonl").write_text("{}\n")
    fixed = apply_override(preset("tiny"), "data.path='right'")
    RunDir(run, RUN_FOLDER).claim(fixed, fresh=False)
    assert (run / "config.toml").read_text() == config_text(fixed)
    assert not (run / "data").exists()
    assert "finished no stage" in capsys.readouterr().out
    (run / "notes.txt").write_text("mine")  # a folder with files lmforge did not write is kept
    with pytest.raises(LmforgeError, match="another config"):
        RunDir(run, RUN_FOLDER).claim(preset("tiny"), fresh=False)


def _other_value(section, name):
    """A valid value of train.SECTION.NAME other than its default."""
    import dataclasses

    f = next(f for f in dataclasses.fields(section) if f.name == name)
    default = getattr(section, name)
    if "choices" in f.metadata:
        return next(c for c in f.metadata["choices"] if c != default)
    if isinstance(default, bool):
        return not default
    if isinstance(default, str):
        return {"layout": "dp=2", "tasks": "code"}[name]
    return default + 1 if isinstance(default, int) else default / 2 or 0.5


@pytest.mark.parametrize("old", sorted(FLAT_KEYS))
def test_each_old_flat_train_key_sets_its_new_place_from_toml_and_set(old, tmp_path, capsys):
    new = FLAT_KEYS[old]
    section, name = new.split(".")
    value = _other_value(getattr(preset("tiny").train, section), name)
    path = tmp_path / "old.toml"
    path.write_text(tomli_w.dumps({"train": {old: value}}))
    literal = tomli_w.dumps({"v": value}).removeprefix("v = ").strip()  # as TOML writes it
    from_toml = load_config("tiny", path)
    from_set = load_config("tiny", None, [f"train.{old}={literal}"])
    assert getattr(getattr(from_toml.train, section), name) == value
    assert from_set == from_toml
    notes = capsys.readouterr().err.splitlines()
    assert notes == [
        f"note: {path}: train.{old} is now train.{new}",
        f"note: --set: train.{old} is now train.{new}",
    ]
    assert load_config("tiny", None, [f"train.{new}={literal}"]) == from_toml
    assert capsys.readouterr().err == ""  # the new key: no note


def test_an_old_key_out_of_range_is_reported_under_its_new_key():
    with pytest.raises(LmforgeError, match=r"^train.optimizer.lr is 0.0: it must be above 0"):
        load_config("tiny", None, ["train.lr=0"])
    with pytest.raises(LmforgeError, match=r"^train.optimizer.lr is 0.0: it must be above 0"):
        load_config("tiny", None, ["train.optimizer.lr=0"])


def test_a_section_name_is_the_old_key_unless_given_a_table(tmp_path):
    path = tmp_path / "mixed.toml"
    path.write_text('[train]\noptimizer = "muon"\nlr = 1e-3\n[train.schedule]\nkind = "cosine"\n')
    cfg = load_config("tiny", path, ["train.parallel=dp=2", "train.parallel.zero1=true"])
    assert (cfg.train.optimizer.name, cfg.train.optimizer.lr) == ("muon", 1e-3)
    assert cfg.train.schedule.kind == "cosine"
    assert (cfg.train.parallel.layout, cfg.train.parallel.zero1) == ("dp=2", True)
    with pytest.raises(LmforgeError, match=r"unknown key train.optimizer.learning_rate; valid"):
        load_config("tiny", None, ["train.optimizer.learning_rate=1"])
    with pytest.raises(LmforgeError, match=r"train.eval is a section: set its keys"):
        apply_dict(preset("tiny"), {"train": {"eval": 3}})


def test_a_run_folders_config_is_written_in_sections():
    text = config_text(preset("small"))
    assert '[train.optimizer]\nname = "muon"\nlr = 0.003' in text
    assert "\nlr = " not in text.split("[train.optimizer]")[0]  # no flat key left in [train]
    assert apply_dict(RunConfig(), tomllib.loads(text), note=False) == preset("small")
