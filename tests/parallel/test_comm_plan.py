"""The planner's communication per step against the bytes a real step moves, on 2 gloo processes.

Each strategy trains one step of the tiny model the way `lmforge train --parallel` builds it
(lmforge.train.compose with a World), with count_collectives on; lmforge.plan.comm predicts the
same step from the model's shape alone. The issue asks for agreement within 5%.
"""

import json
import os
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

WORLD, MICRO_BATCH, SEQ_LEN = 2, 2, 32


class Case(NamedTuple):
    parallel: str  # train.parallel.layout
    precision: str
    layout: dict  # the planner's Layout
    sequence_parallel: bool = False
    grad_bytes: int | None = None  # the planner's override where lmforge reduces in fp32


CASES = {
    "ddp": Case("dp=2", "fp32", {"dp": 2}),
    "ddp_bf16": Case("dp=2", "bf16", {"dp": 2}, grad_bytes=4),  # autocast: fp32 grads
    "fsdp": Case("fsdp=2", "fp32", {"fsdp": 2}),
    "fsdp_bf16": Case("fsdp=2", "bf16", {"fsdp": 2}, grad_bytes=4),  # reduce_dtype fp32
    "tp": Case("tp=2", "fp32", {"tp": 2}),
    "tp_sp": Case("tp=2", "fp32", {"tp": 2, "sp": True}, sequence_parallel=True),
}


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("comm_plan")
    from tests.parallel.conftest import run_ranks  # here: the ranks run this file as a script

    run_ranks(Path(__file__), [str(out)], WORLD)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert ranks[0] == ranks[1]  # every strategy here moves the same bytes on every rank
    return ranks[0]


@pytest.mark.parametrize("name", list(CASES))
def test_planned_bytes_per_step_match_counted_within_5_percent(counted, name):
    from lmforge.config import preset
    from lmforge.plan.comm import comm_bytes_per_step
    from lmforge.plan.layout import Layout
    from lmforge.plan.shapes import from_model_config

    case = CASES[name]
    shape = from_model_config("tiny", preset("tiny").model)
    planned = comm_bytes_per_step(
        shape,
        Layout(**case.layout),
        MICRO_BATCH,
        SEQ_LEN,
        precision=case.precision,
        grad_bytes=case.grad_bytes,
    )
    by_op = {op: nbytes for op, (_, nbytes) in counted[name].items()}
    measured = sum(by_op.values())
    assert sum(planned.values()) == pytest.approx(measured, rel=0.05), (planned, by_op)


# ---- the worker, run by torchrun ------------------------------------------------------------


def _one_step(case: Case) -> dict:
    from lmforge.config import preset
    from lmforge.model import Transformer
    from lmforge.parallel.comm_count import count_collectives
    from lmforge.parallel.parallelize import ParallelOptions
    from lmforge.parallel.world import distributed
    from lmforge.train.compose import compose
    from lmforge.train.precision import make_precision

    cpu = torch.device("cpu")
    config = preset("tiny").model
    torch.manual_seed(0)
    model = Transformer(config)
    ids = torch.randint(0, config.vocab_size, (MICRO_BATCH, SEQ_LEN + 1))
    precision = make_precision(case.precision, cpu)
    with distributed(case.parallel, cpu, timeout_s=60) as world:
        options = ParallelOptions(sequence_parallel=case.sequence_parallel)
        composed = compose(model, precision, cpu, world=world, parallel=options)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with count_collectives() as counter:
            with composed.micro_step(last=True):
                composed.loss(ids[:, :-1], ids[:, 1:]).backward()
            optimizer.step()
    return counter.by_op


def _worker(out: Path) -> None:
    dist.init_process_group("gloo")
    record = {name: _one_step(case) for name, case in CASES.items()}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    dist.barrier()  # as lmforge.parallel.world: no rank tears down while another works
    dist.destroy_process_group()
    # About 1 run in 15 under pytest, the interpreter's own teardown then aborts ("terminate
    # called without an active exception", after every collective and the destroy above
    # returned); the results are written, so leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
