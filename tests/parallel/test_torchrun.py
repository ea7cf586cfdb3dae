"""The real command line under torchrun: `lmforge train --parallel fsdp=2` on 2 processes."""

import json
import os
import subprocess
import sys

from lmforge.train.checkpoint import list_checkpoints
from lmforge.train.metrics import read_metrics


def test_train_under_torchrun(launcher, tmp_path):
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "lmforge",
        "train",
        "--preset",
        "tiny",
        "--data",
        str(launcher.shard_dir),
        "--max-steps",
        "3",
        "--parallel",
        "fsdp=2",
        "--out",
        str(out),
        "--set",
        "train.log_every=1",
        "--set",
        "train.eval_batches=1",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", LMFORGE_PROGRESS="0")
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "parallel fsdp=2 over 2 processes" in done.stdout
    assert done.stdout.count("done: step 3") == 1  # rank 0 alone prints the summary
    steps = [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]  # rank 0 alone writes metrics
    assert steps[-1]["comm_bytes_per_step"] > 0
    final = list_checkpoints(out / "checkpoints")[-1]
    assert (final / "dcp" / ".metadata").is_file() and (final / "model.safetensors").is_file()
    assert json.loads((final / "config.json").read_text())["run"]["train"]["parallel"] == "fsdp=2"
