"""lmforge.parallel as a library on a user's own module, under torch.multiprocessing.spawn.

`library_user.py` is the user's program: it starts its own gloo group of 2 processes, builds a
World from it, shards a toy two-layer module with FSDP (one chosen unit) and, separately,
trains it under DDP with ZeRO-1 of torch.optim.SGD, then gathers `full_state_dict`. Both must
match the same module trained in one process on the whole batch (only the order of sums
differs: rtol 1e-5, atol 1e-6).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

USER = Path(__file__).with_name("library_user.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("library")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(USER), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return torch.load(out / "parallel.pt"), torch.load(out / "reference.pt")


@pytest.mark.parametrize("name", ["fsdp", "zero1"])
def test_users_module_trains_like_one_process(name, results):
    got, want = results
    assert got[name].keys() == want[name].keys()  # the plain module's names, no `module.`
    for key, value in want[name].items():
        assert not torch.equal(value, want["init"][key]), key  # the reference did train
        torch.testing.assert_close(got[name][key], value, rtol=1e-5, atol=1e-6)


def test_fsdp_shards_the_chosen_units_and_zero1_the_optimizer_state(results):
    got, want = results
    assert got["fsdp_sharded"] == "DTensor"
    total = sum(v.numel() for v in want["init"].values())
    assert 0 < got["zero1_local_params"] < total  # rank 0 steps only its share


def test_step_unless_skips_a_bad_step_for_any_optimizer(results):
    got, _ = results
    before, skipped, stepped = got["zero1"], got["zero1_after_skip"], got["zero1_after_step"]
    assert all(torch.equal(before[k], skipped[k]) for k in before)
    assert not all(torch.equal(before[k], stepped[k]) for k in before)


def test_library_names_import_lazily_from_the_package():
    import lmforge.parallel as parallel
    from lmforge.parallel.data_parallel import build_zero1
    from lmforge.parallel.world import World

    assert parallel.World is World and parallel.build_zero1 is build_zero1
    with pytest.raises(AttributeError):
        parallel.no_such_name  # noqa: B018


def test_world_from_group_needs_a_group_the_user_started():
    from lmforge.errors import LmforgeError
    from lmforge.parallel import World

    with pytest.raises(LmforgeError, match="call dist.init_process_group first"):
        World.from_group("fsdp=2")
