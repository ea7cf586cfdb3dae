"""Process groups on gloo for the parallel tests (ranks forked from a server that has torch
imported: tests/forked.py), and the tiny model they train."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests import forked

WORKER = Path(__file__).with_name("worker.py")

MODEL = dict(vocab_size=320, d_model=64, n_layers=2, n_heads=4, max_seq_len=32)
TRAIN = dict(
    batch_size=8,
    seq_len=32,
    lr=3e-3,
    warmup_steps=2,
    max_steps=4,
    eval_every=0,
    eval_batches=1,
    log_every=1,
    seed=7,
    device="cpu",
    collective_timeout_s=60.0,
)
MUON = {"optimizer": "muon", "embed_lr": 0.03}
"""The speedrun's optimizer: Muon for the blocks' matrices, AdamW with the input embedding at
ten times lr for the rest."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env(rank: int, world_size: int, port: int) -> dict:
    return {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        "LMFORGE_PROGRESS": "0",
    }


def start_ranks(script: Path, args: list[str], world_size: int, tmp: Path) -> list:
    """Start `script args` as the `world_size` ranks of a group on this machine, with the
    environment `torchrun --standalone --nproc-per-node=world_size` gives them (RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT for `init_process_group`), forked from a process
    that has torch imported (tests/forked.py). Returns (process, log file) per rank."""
    port = free_port()
    ranks = []
    for rank in range(world_size):
        log = tmp / f"rank{rank}_{port}.log"
        command = [sys.executable, str(script), *args]
        ranks.append((forked.start(command, launch_env(rank, world_size, port), log), log))
    return ranks


def wait_for_ranks(ranks: list, timeout: float) -> tuple[list[int], list[str]]:
    """Each rank's exit code and output, once all have exited; a rank still running after
    `timeout` seconds (from the first wait) is killed."""
    deadline = time.monotonic() + timeout
    for process, _ in ranks:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
    for process, _ in ranks:
        if process.poll() is None:
            process.kill()
            process.wait()
    return [p.returncode for p, _ in ranks], [log.read_text() for _, log in ranks]


def spawn_group(world_size: int, runs: list[dict], shard_dir, tmp: Path, timeout: float = 300):
    """Run `runs` in a group of `world_size` ranks (worker.py); return their exit codes and
    outputs."""
    spec = tmp / f"spec_{world_size}_{len(list(tmp.glob('spec_*')))}.json"
    spec.write_text(json.dumps({"shard_dir": str(shard_dir), "model": MODEL, "runs": runs}))
    return wait_for_ranks(start_ranks(WORKER, [str(spec)], world_size, tmp), timeout)


def run_ranks(script: Path, args: list[str], world_size: int = 2, timeout: float = 120) -> None:
    """Run `script args` as the `world_size` ranks of a group (start_ranks). Fails with each
    rank's output if a rank fails or hangs."""
    with tempfile.TemporaryDirectory() as tmp:
        codes, outputs = wait_for_ranks(start_ranks(script, args, world_size, Path(tmp)), timeout)
    failed = [
        f"rank {rank}:\n{out[-3000:]}"
        for rank, (code, out) in enumerate(zip(codes, outputs, strict=True))
        if code
    ]
    assert not failed, "\n".join(failed)


class Launcher:
    """What the parallel tests share: the tiny model and run settings, the shards, and
    `spawn` (a process group) and `single` (a run in this process) on them."""

    model = MODEL
    train = TRAIN

    def __init__(self, shard_dir: Path) -> None:
        self.shard_dir = shard_dir

    def spawn(self, world_size: int, runs: list[dict], tmp: Path):
        return spawn_group(world_size, runs, self.shard_dir, tmp)

    @staticmethod
    def losses(out: Path) -> list[float]:
        """The logged training losses of the run in `out`."""
        from lmforge.train.metrics import read_metrics

        return [r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]

    @staticmethod
    def weights(out: Path) -> dict:
        """The final checkpoint's weights of the run in `out`."""
        from safetensors.torch import load_file

        from lmforge.train.checkpoint_dir import list_checkpoints

        return load_file(list_checkpoints(out / "checkpoints")[-1] / "model.safetensors")

    def assert_same_weights(self, got: dict, want: dict, outliers: float = 1e-3) -> None:
        """fp32 weights of two runs that differ only in the order of floating-point sums.

        Elements agree to rtol 1e-4 / atol 1e-5, except that Adam divides each gradient by its
        own scale, so an element whose gradient is nearly zero can take a whole ±lr step on
        rounding noise alone: up to `outliers` of a tensor's elements may differ by at most
        2·lr per step.
        """
        bound = 2 * self.train["lr"] * self.train["max_steps"]
        for key, value in got.items():
            difference = (value - want[key]).abs()
            off = difference > 1e-5 + 1e-4 * want[key].abs()
            assert off.float().mean() <= outliers and difference.max() <= bound, key

    def single(self, out: Path, model_changes: dict | None = None, **overrides):
        from lmforge.model import ModelConfig
        from lmforge.train import train
        from lmforge.train.config import train_config

        cfg = train_config({**TRAIN, **overrides})
        return train(ModelConfig(**{**MODEL, **(model_changes or {})}), cfg, self.shard_dir, out)


@pytest.fixture(scope="session")
def launcher(prepared):
    return Launcher(prepared.shard_dir)


REFERENCES = {
    "fp32": {},
    "accum": {"grad_accum_steps": 2},
    "bf16": {"precision": "bf16"},
    "unfused": {"fused_adamw": False},
    "muon": MUON,
}
EXTENDED = {
    "fp32_extended": {},
    "unfused_extended": {"fused_adamw": False},
    "muon_extended": MUON,
}
"""Runs trained to half the steps, then extended to all of them (a new schedule tail): what a
checkpoint resumed at another layout must reproduce."""


@pytest.fixture(scope="session")
def references(launcher, tmp_path_factory):
    """Single-process runs the parallel ones must reproduce: fp32, fp32 with 2 micro-batches
    of gradient accumulation, bf16 autocast, fp32 with lmforge's AdamW (fused_adamw=false)
    and with Muon; and the three optimizers trained to half the steps, then extended."""
    root = tmp_path_factory.mktemp("reference")
    for name, overrides in REFERENCES.items():
        launcher.single(root / name, **overrides)
    for name, overrides in EXTENDED.items():
        launcher.single(root / name, **overrides, max_steps=TRAIN["max_steps"] // 2)
        launcher.single(root / name, **overrides)
    return root
