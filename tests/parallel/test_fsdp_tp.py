"""Four processes: FSDP × TP, DP × TP and DP × FSDP (HSDP) train like one process, FSDP × TP
also with lmforge's AdamW (`train.optimizer.fused_adamw=false`, against one process with the same
optimizer; the 1-D layouts run both in test_strategies.py); a dead rank makes the survivors
stop with a clear error instead of hanging.

Tolerance as for the other fp32 strategies: loss to 1e-4, weights as `Launcher.assert_same_weights`.
"""

import pytest

LAYOUTS = {"fsdp_tp": "fsdp=2,tp=2", "dp_tp": "dp=2,tp=2", "hsdp": "dp=2,fsdp=2"}
RUNS = {k: (v, True) for k, v in LAYOUTS.items()}  # (layout, train.optimizer.fused_adamw)
RUNS["fsdp_tp_unfused"] = (LAYOUTS["fsdp_tp"], False)


@pytest.fixture(scope="module")
def group(launcher, tmp_path_factory):
    root = tmp_path_factory.mktemp("group4")
    train = {**launcher.train, "collective_timeout_s": 20.0}
    runs = [
        {"out": str(root / k), "train": {**train, "parallel": v, "fused_adamw": fused}}
        for k, (v, fused) in RUNS.items()
    ]
    runs.append({"out": str(root / "dead_rank"), "train": train, "die": True})
    codes, outputs = launcher.spawn(4, runs, root)
    return root, codes, outputs


@pytest.mark.parametrize("name", RUNS)
def test_two_dimensional_layout_matches_single_process(name, group, references, launcher):
    reference = references / ("fp32" if RUNS[name][1] else "unfused")
    root, _, outputs = group
    assert (root / name / "metrics.jsonl").exists(), outputs[0][-3000:]
    assert launcher.losses(root / name) == pytest.approx(launcher.losses(reference), abs=1e-4)
    launcher.assert_same_weights(launcher.weights(root / name), launcher.weights(reference))


def test_dead_rank_stops_the_others_with_a_clear_error(group):
    root, returncodes, outputs = group
    assert returncodes[1] == 3  # the rank that died
    assert [returncodes[r] for r in (0, 2, 3)] == [0, 0, 0], outputs[0][-3000:]
    message = (root / "dead_rank" / "error.txt").read_text()
    assert message.startswith("rank 0: a collective failed")
    assert "train.parallel.collective_timeout_s=20" in message
