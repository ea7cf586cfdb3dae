"""The stages `lmforge train` and the speedrun compose: prepare claims the folder and keeps its
time out of the budget, the built-in corpus goes to the cache, and one mapping tells how a run
ended (the commands' exit statuses themselves: tests/train/test_stop_exit.py)."""

from pathlib import Path

import pytest

import lmforge.stages as stages
from lmforge.budget_clock import BudgetClock
from lmforge.config import apply_override, preset
from lmforge.prepare import Prepared
from lmforge.tokens.shards import ShardMeta, write_meta
from lmforge.train import TrainResult


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def preparing(monkeypatch):
    """prepare_corpus as a stand-in that takes 100 s of `now` and records where it prepared."""
    now, roots = FakeClock(), []

    def prepare_corpus(data, tokenizer, root):
        roots.append(Path(root))
        now.t += 100.0
        return Prepared(Path(root), {})

    monkeypatch.setattr(stages, "prepare_corpus", prepare_corpus)
    return now, roots


def test_prepare_claims_the_folder_and_its_time_is_not_on_the_budget(preparing, tmp_path):
    now, roots = preparing
    clock = BudgetClock(now)
    now.t += 2.0  # start-up: on the budget
    cfg = apply_override(preset("tiny"), f"data.path={str(tmp_path)!r}")
    data = stages.prepare(cfg, tmp_path / "run", clock=clock)
    assert clock.elapsed() == 2.0  # the 100 s of preparation are excluded
    assert roots == [tmp_path / "run"]  # data named by path is prepared in the run folder
    assert data.shard_dir == tmp_path / "run" / "tokens" and data.documents == str(tmp_path)
    assert (tmp_path / "run" / "config.toml").is_file()  # the folder is claimed


def test_the_built_in_corpus_is_prepared_once_into_the_cache(preparing, tmp_path, monkeypatch):
    _, roots = preparing
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))
    data = stages.prepare(preset("tiny"), tmp_path / "run", cached=True)
    assert roots == [stages.cache_root(preset("tiny"))] and data.documents == "stdlib"
    assert roots[0].is_relative_to(tmp_path / "cache")
    stages.prepare(preset("tiny"), tmp_path / "speedrun")  # the speedrun's: in its folder
    assert roots[1] == tmp_path / "speedrun"


def test_ready_made_shards_are_claimed_not_prepared(preparing, tmp_path):
    _, roots = preparing
    shards = {name: {"tokens": 0, "documents": 0} for name in ("train", "val")}
    write_meta(tmp_path / "shards", ShardMeta("uint16", 256, "bytes", shards))
    data = stages.prepare(preset("tiny"), tmp_path / "run", shard_dir=tmp_path / "shards")
    assert not roots and data == stages.Data(tmp_path / "shards", None)
    assert (tmp_path / "run" / "config.toml").is_file()


def test_bad_settings_fail_before_the_folder_is_claimed(preparing, tmp_path):
    with pytest.raises(Exception, match="threads"):
        stages.prepare(preset("tiny"), tmp_path / "run", threads=-1)
    assert not (tmp_path / "run").exists()


def _result(**kw) -> TrainResult:
    return TrainResult(step=7, checkpoint=Path("c/step_7"), final_eval=None, tokens_per_s=1.0,
                       seconds=1.0, **kw)  # fmt: skip


def test_one_mapping_from_how_a_run_ended_to_its_exit_status(capsys):
    assert stages.ending(_result()) == stages.Ending("finished", 0, "")
    stopped = stages.ending(_result(interrupted=True, stop_signal="SIGTERM"))
    assert stopped.how == "interrupted" and stopped.exit_status == 143
    assert stopped.message.startswith("stopped (SIGTERM received) at step 7; checkpoint c")
    other = _result(interrupted=True, stop_signal="another rank's stop request")
    assert stages.command_status(other) == 130
    assert "stopped (another rank's stop request received) at step 7" in capsys.readouterr().err
