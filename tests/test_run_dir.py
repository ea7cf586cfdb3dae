"""The run folder: folders the previous release wrote (tests/fixtures/old_runs, made by its
`claim_run_dir`s) still resume, refuse another config in one line, and take a new length."""

import shutil
from pathlib import Path

import pytest

from lmforge.config import RUN_FOLDER, apply_override, config_text, preset
from lmforge.errors import LmforgeError
from lmforge.model.lora_spec import LoraSpec
from lmforge.posttrain.grpo import RL_FOLDER
from lmforge.posttrain.rl_config import RlConfig, recorded
from lmforge.run_dir import RunDir, RunKind

OLD_RUNS = Path(__file__).parent / "fixtures" / "old_runs"
# What made the RL fixture: the settings grpo() recorded for this run (settings added since
# are recorded only where they differ from the values such runs had).
OLD_RL = {
    **recorded(RlConfig(steps=3, prompts_per_step=4, group_size=4, lr=2e-5)),
    "base": "runs/tiny/checkpoints/step_100",
    "lora": LoraSpec().to_dict(),
}


@pytest.fixture
def old_pretraining(tmp_path) -> Path:
    """A copy of a `--preset tiny` run folder as the previous release wrote it."""
    return Path(shutil.copytree(OLD_RUNS / "pretrain", tmp_path / "pretrain"))


@pytest.fixture
def old_rl(tmp_path) -> Path:
    """A copy of an rl run folder (LoRA adapters) as the previous release wrote it."""
    return Path(shutil.copytree(OLD_RUNS / "rl", tmp_path / "rl"))


def test_an_old_pretraining_folder_resumes_with_the_same_config(old_pretraining, capsys):
    run = RunDir(old_pretraining, RUN_FOLDER)
    run.claim(preset("tiny"))
    assert capsys.readouterr().out == f"resuming the run in {old_pretraining}\n"
    assert (old_pretraining / "config.toml").read_text() == config_text(preset("tiny"))
    assert (old_pretraining / "metrics.jsonl").exists()  # the run's work is kept


def test_an_old_pretraining_folder_refuses_another_config_in_one_line(old_pretraining):
    before = (old_pretraining / "config.toml").read_text()
    other = apply_override(preset("tiny"), "train.optimizer.lr=0.5")
    with pytest.raises(LmforgeError) as refused:
        RunDir(old_pretraining, RUN_FOLDER).claim(other)
    assert str(refused.value) == (
        f"{old_pretraining} holds a run with another config (train.optimizer.lr: 0.003 → 0.5): "
        "pass --fresh to start over there, or --out for a new run folder"
    )
    assert (old_pretraining / "config.toml").read_text() == before  # nothing touched
    assert (old_pretraining / "metrics.jsonl").exists()
    RunDir(old_pretraining, RUN_FOLDER).claim(other, fresh=True)
    assert not (old_pretraining / "metrics.jsonl").exists()
    assert (old_pretraining / "config.toml").read_text() == config_text(other)


def test_an_old_pretraining_folder_takes_a_new_length(old_pretraining, capsys):
    longer = apply_override(preset("tiny"), "train.max_steps=300")
    longer = apply_override(longer, "train.minutes=2")
    RunDir(old_pretraining, RUN_FOLDER).claim(longer)
    assert capsys.readouterr().out == (
        f"resuming the run in {old_pretraining} with a new length or layout "
        "(train.max_steps: 100 → 300, train.minutes: 0.0 → 2.0)\n"
    )
    assert (old_pretraining / "config.toml").read_text() == config_text(longer)
    with pytest.raises(LmforgeError, match=r"another config \(train.max_steps: 300 → 100, "):
        RunDir(old_pretraining, RUN_FOLDER).claim(apply_override(preset("tiny"), "train.seed=1"))


def test_a_run_resumes_on_another_parallel_layout(old_pretraining, capsys):
    spread = apply_override(preset("tiny"), "train.parallel.layout=tp=2")
    RunDir(old_pretraining, RUN_FOLDER).claim(apply_override(spread, "train.compute.compile=true"))
    assert (
        "with a new length or layout (train.compute.compile: False → True, "
        "train.parallel.layout: '' → tp=2)" in (capsys.readouterr().out)
    )


def test_an_old_rl_folder_resumes_refuses_and_takes_a_new_length(old_rl, capsys):
    run = RunDir(old_rl, RL_FOLDER)
    run.claim(OLD_RL)
    assert capsys.readouterr().out == f"resuming the run in {old_rl}\n"
    assert run.saved() == OLD_RL
    run.claim({**OLD_RL, "steps": 30, "eval_every": 10}, quiet=True)
    assert capsys.readouterr().out == ""
    assert run.saved()["steps"] == 30
    for changed, shown in [
        ({"lr": 1e-3}, "lr: 2e-05 → 0.001"),
        ({"lora": {**OLD_RL["lora"], "r": 16}}, "lora.r: 8 → 16"),  # nested: compared flat
        ({"lora": None}, "lora.alpha: 16.0 → (default), lora.dropout: 0.0 → (default)"),
    ]:
        with pytest.raises(LmforgeError) as refused:
            run.claim({**OLD_RL, "steps": 30, "eval_every": 10, **changed})
        assert str(refused.value).startswith(f"{old_rl} holds an rl run with another config (")
        assert shown in str(refused.value) and "\n" not in str(refused.value)
    assert (old_rl / "metrics.jsonl").exists()  # an rl folder is never taken over


def test_an_unreadable_config_is_named_and_a_folder_that_finished_nothing_is_taken_over(
    tmp_path, capsys
):
    kind = RunKind("a test run", "settings.json", entries=("settings.json", "partial"),
                   finished=lambda out: (out / "done").exists())  # fmt: skip
    run = RunDir(tmp_path / "run", kind)
    run.claim({"a": 1})
    (run.path / "settings.json").write_text("{not json")
    (run.path / "partial").mkdir()
    run.claim({"a": 2})  # nothing finished: the new config takes the folder over
    assert "finished no stage" in capsys.readouterr().out
    assert run.saved() == {"a": 2} and not (run.path / "partial").exists()
    (run.path / "settings.json").write_text("[1]")
    (run.path / "done").write_text("")
    with pytest.raises(LmforgeError, match=r"a test run with another config \(its settings.json "
                       r"is not valid JSON\): pass --fresh"):  # fmt: skip
        run.claim({"a": 2})
