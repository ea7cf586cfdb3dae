"""The real command line under torchrun: `lmforge train --parallel fsdp=2` on 2 processes."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

from lmforge.train.checkpoint_dir import list_checkpoints
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
        "train.eval.batches=1",
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
    assert (
        json.loads((final / "config.json").read_text())["run"]["train"]["parallel"]["layout"]
        == "fsdp=2"
    )


def test_train_under_torchrun_without_data_prepares_on_rank_zero(corpus_dir, tmp_path):
    """No --data: rank 0 prepares the corpus while rank 1 waits for its marker, then both train
    on the same shards (here a small corpus via data.path; the built-in one takes the same
    path into the cache)."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "lmforge", "train", "--preset", "tiny"]
    command += ["--max-steps", "2", "--parallel", "fsdp=2", "--out", str(out)]
    command += ["--set", f"data.path={corpus_dir}", "--set", "data.workers=1"]
    command += ["--set", "train.eval.batches=1", "--set", "train.eval.every=0"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", LMFORGE_PROGRESS="0", LMFORGE_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("done: step 2") == 1
    assert done.stdout.count("tokenizer: vocab") == 1  # prepared once, by rank 0
    assert (out / "tokens" / "meta.json").is_file()
    assert not list(out.glob(".prepared-*"))  # the marker is gone once every rank read it


def test_a_stop_signal_on_one_rank_stops_every_rank_at_the_same_step(launcher, tmp_path):
    """SIGTERM reaching rank 1 only: both ranks agree at a log step and checkpoint, instead of
    rank 0 waiting in the next step's collectives until the timeout; rank 1 exits 143 (its
    SIGTERM), rank 0 130 (stopped at another rank's request)."""
    out = tmp_path / "run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "lmforge", "train", "--preset", "tiny"]
    command += ["--data", str(launcher.shard_dir), "--max-steps", "1000", "--parallel", "dp=2"]
    command += ["--out", str(out), "--set", "train.log_every=2", "--set", "train.eval.every=0"]
    command += ["--set", "train.eval.batches=1", "--set", "train.parallel.collective_timeout_s=60"]
    ranks = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        env.update(LMFORGE_PROGRESS="0")
        ranks.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    deadline = time.monotonic() + 180
    while not (out / "metrics.jsonl").is_file() or not any(
        r.get("step", 0) >= 4 for r in read_metrics(out / "metrics.jsonl")
    ):
        assert time.monotonic() < deadline and ranks[0].poll() is None, "the run did not start"
        time.sleep(0.2)
    ranks[1].send_signal(signal.SIGTERM)
    outputs = [r.communicate(timeout=120)[0].decode() for r in ranks]
    assert [r.returncode for r in ranks] == [130, 143], outputs[0][-2000:] + outputs[1][-2000:]
    assert "another rank's stop request received at step" in outputs[0]
    stopped = int(outputs[0].split("stop request received at step ")[1].split(":")[0])
    assert stopped % 2 == 0 and 4 <= stopped < 1000
    final = list_checkpoints(out / "checkpoints")[-1]
    assert final.name == f"step_{stopped}"
