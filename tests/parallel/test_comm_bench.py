"""`lmforge bench comm`: size and op parsing, and a real run on 2 gloo processes under torchrun."""

import json
import os
import subprocess
import sys

import pytest

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.parallel.comm_bench import OPS, bench_comm, parse_ops, parse_sizes

FACTORS_2 = {  # nccl-tests' bus bandwidth factors at n = 2
    "all_reduce": 1.0,
    "all_gather": 0.5,
    "reduce_scatter": 0.5,
    "broadcast": 1.0,
    "all_to_all": 0.5,
}


@pytest.fixture(scope="module")
def torchrun_output(tmp_path_factory):
    out = tmp_path_factory.mktemp("comm_bench") / "comm.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += ["-m", "lmforge", "bench", "comm", "--sizes", "1K..4K", "--iters", "3"]
    cmd += ["--warmup", "1", "--json", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120, env=env)
    return done.stdout, json.loads(out.read_text())


def test_sizes_are_the_powers_of_two_in_a_range():
    assert parse_sizes("1K..8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("64m") == [64 << 20]
    assert len(parse_sizes("1K..256M")) == 19


@pytest.mark.parametrize("spec", ["3K", "1K..", "8K..1K", "1X", "", "0..4K"])
def test_bad_sizes_are_one_line_errors(spec):
    with pytest.raises(LmforgeError, match="--sizes|size"):
        parse_sizes(spec)


def test_ops_parse_all_or_a_list_and_reject_unknown_names():
    assert parse_ops("all") == list(OPS)
    assert parse_ops("broadcast, all_reduce") == ["broadcast", "all_reduce"]
    with pytest.raises(LmforgeError, match="unknown op allreduce"):
        parse_ops("allreduce")


def test_cli_reports_bad_input_as_one_line(capsys):
    assert main(["bench", "comm", "--sizes", "1K..3K"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: size '3K'") and err.count("\n") == 1


def test_one_process_without_torchrun_runs_and_says_so(capsys):
    results = bench_comm([1024], ["all_reduce", "broadcast"], iters=2, warmup=0, device_name="cpu")
    assert [(m.op, m.bytes) for m in results] == [("all_reduce", 1024), ("broadcast", 1024)]
    assert [m.busbw_gbps for m in results] == [0.0, results[1].algbw_gbps]
    assert "note: one process" in capsys.readouterr().out


def test_torchrun_table_lists_every_op_and_size(torchrun_output):
    stdout, _ = torchrun_output
    assert "collectives on 2 processes, gloo on cpu" in stdout
    rows = [line.split() for line in stdout.splitlines() if line.startswith(OPS)]
    assert [row[:2] for row in rows] == [[op, size] for op in OPS for size in ("1K", "2K", "4K")]
    assert all(len(row) == 5 for row in rows)


def test_torchrun_json_has_bus_bandwidth_by_the_standard_factors(torchrun_output):
    _, record = torchrun_output
    assert (record["world_size"], record["backend"], record["iters"]) == (2, "gloo", 3)
    assert record["bus_factor"] == FACTORS_2
    for op in OPS:
        rows = [r for r in record["results"] if r["op"] == op]
        assert [r["bytes"] for r in rows] == [1024, 2048, 4096]
        for r in rows:
            assert r["latency_us"] > 0
            assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["latency_us"] / 1e3, rel=1e-9)
            assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * FACTORS_2[op], rel=1e-12)
