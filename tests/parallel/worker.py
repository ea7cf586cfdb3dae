"""One rank of a spawned test group: runs the listed training runs in order, in one process.

Usage (the launcher sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):
    python worker.py SPEC.json
SPEC holds {"shard_dir", "model": {...}, "runs": [{"out", "train": {...}}, ...]}; a run may
carry its own "model" changes (e.g. a mixture of experts). Runs share
one process group, so a group pays Python and torch start-up once for many strategies. A run
that raises LmforgeError records the message in OUT/error.txt (rank 0) and the group goes on.
A run with "die": true makes rank 1 exit abruptly after joining, to test the survivors.
"""

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("LMFORGE_PROGRESS", "0")


def main(spec_path: str) -> None:
    import torch.distributed as dist

    from lmforge.errors import LmforgeError
    from lmforge.model import ModelConfig
    from lmforge.parallel.world import distributed, mean_over_data
    from lmforge.train import train
    from lmforge.train.config import train_config

    spec = json.loads(Path(spec_path).read_text())
    rank = int(os.environ["RANK"])
    # One group for all runs (train() joins an existing one), timing out like the first run asks.
    timeout = spec["runs"][0]["train"].get("collective_timeout_s", 60)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    for run in spec["runs"]:
        cfg = train_config(run["train"])
        out = Path(run["out"])
        try:
            if run.get("die"):
                import torch

                with distributed(
                    cfg.parallel.layout, torch.device("cpu"), cfg.parallel.collective_timeout_s
                ):
                    if rank == 1:
                        os._exit(3)
                    mean_over_data(torch.ones(()))  # the peer is gone: this must fail
                continue
            model = ModelConfig(**{**spec["model"], **run.get("model", {})})
            train(model, cfg, spec["shard_dir"], out)
        except LmforgeError as e:
            if rank == 0:
                out.mkdir(parents=True, exist_ok=True)
                (out / "error.txt").write_text(str(e))
            if run.get("die"):
                return


if __name__ == "__main__":
    main(sys.argv[1])
