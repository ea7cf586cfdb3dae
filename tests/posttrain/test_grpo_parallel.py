"""GRPO on 2 gloo processes: `lmforge rl --parallel fsdp=2` and `--parallel dp=2`, on ranks
started as torchrun starts them (tests/parallel/conftest.py::start_ranks; the pretraining tests
run torchrun itself), train like one process.

The command line is `lmforge`'s (tests/posttrain/rl_main.py adds the `digits` task, whose reward
gives an untrained model's groups signal). A step samples 3 prompts × 3 completions, so the 9
rows split unevenly over the 2 data ranks and one of them pads; it takes 2 optimizer steps per
rollout batch (stored old log-probs) with a KL penalty (a reference model on every rank). The
ranks sample their shares of the prompts and gather them: the rollouts (rewards, lengths) are
the one process's. Tolerances are the pretraining parallel tests' (tests/parallel/conftest.py,
tests/parallel/test_strategies.py): the logged loss to 1e-4 and the final weights by
`Launcher.assert_same_weights`; only the order of floating-point sums differs.
"""

from pathlib import Path

import pytest

from lmforge.cli import main
from lmforge.train.metrics import read_metrics
from tests.parallel.conftest import Launcher, start_ranks, wait_for_ranks
from tests.posttrain.rl_main import digits_task

MAIN = Path(__file__).with_name("rl_main.py")
STEPS, ITERATIONS, LR = 3, 2, 1e-3
OPTIMIZER = {"lr": LR, "max_steps": STEPS * ITERATIONS}  # what Launcher's weight bound reads
SAME = ("reward_mean", "reward_std", "response_length", "groups", "groups_drawn", "skipped_steps")


def flags(base, out: Path) -> list[str]:
    return [
        "rl", "--checkpoint", str(base), "--task", "digits", "--group-size", "3",
        "--prompts-per-step", "3", "--max-new-tokens", "12", "--steps", str(STEPS), "--lr",
        str(LR), "--num-iterations", str(ITERATIONS), "--beta", "0.04", "--device", "cpu",
        "--threads", "1", "--out", str(out), "--set", "rl.micro_batch=2", "--set",
        "rl.warmup_steps=1", "--set", "rl.eval_problems=4", "--set", "rl.eval_samples=1",
        "--set", "rl.train_problems=200", "--set", "rl.engine_batch=16", "--set",
        "rl.eval_every=0", "--set", "rl.checkpoint_every=2",
    ]  # fmt: skip


class RlLauncher(Launcher):
    """The parallel tests' comparisons, with Adam's bound for this run's optimizer steps."""

    train = OPTIMIZER


@pytest.fixture(scope="module")
def single(base_checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rl_single") / "run"
    with digits_task():
        assert main(flags(base_checkpoint, out)) == 0
    return out


def _ranks(base, out: Path, layout: str) -> tuple[list[int], list[str]]:
    """The exit code and output of each of the 2 ranks of `rl --parallel layout`."""
    args = [*flags(base, out), "--parallel", layout]
    return wait_for_ranks(start_ranks(MAIN, args, 2, out.parent), timeout=240)


def _steps(out: Path) -> list[dict]:
    return [r for r in read_metrics(out / "metrics.jsonl") if "reward_mean" in r]


@pytest.mark.parametrize("layout", ["fsdp=2", "dp=2"])
def test_grpo_on_two_processes_trains_like_one_process(layout, single, base_checkpoint, tmp_path):
    out = tmp_path / "run"
    codes, outputs = _ranks(base_checkpoint, out, layout)
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "".join(outputs).count(f"done: step {STEPS}") == 1  # rank 0 alone reports
    got, want = _steps(out), _steps(single)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))  # rank 0 alone writes metrics
    for a, b in zip(got, want, strict=True):
        assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}  # the same rollouts
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-4)
    assert any(r["loss"] != 0 for r in want) and want[-1]["kl"] > 0  # it learned something
    launcher = RlLauncher(None)
    launcher.assert_same_weights(launcher.weights(out), launcher.weights(single))
    final = sorted((out / "checkpoints").iterdir())[-1]
    assert final.name == f"step_{STEPS}" and (final / "dcp" / ".metadata").is_file()
    assert (out / "rl.json").is_file() and (out / "report.md").is_file()
