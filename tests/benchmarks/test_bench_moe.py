"""benchmarks/bench_moe.py runs end to end on a CPU in its quick mode, on a small real corpus."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_moe_benchmark_writes_every_row_in_quick_mode(prepared, tmp_path):
    out = tmp_path / "moe.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_moe.py"), "--quick"]
    command += ["--shards", str(prepared.shard_dir), "--out", str(out), "--threads", "1"]
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == f"wrote {out}"
    result = json.loads(out.read_text())
    assert result["quick"] is True and result["threads"] == 1
    rows = {r["row"]: r for r in result["rows"]}
    assert len(rows) == 6 and {"training tokens/s", "parameters, active per token"} <= set(rows)
    for r in rows.values():
        assert r["dense"] > 0 and r["moe"] > 0 and r["ratio"] > 0, r
        assert math.isfinite(r["dense"]) and math.isfinite(r["moe"]), r
    params = rows["parameters, active per token"]
    assert rows["parameters, total"]["moe"] > params["moe"]  # idle experts are not active
    assert abs(params["ratio"] - 1) < 0.05  # equal active FFN; the routers add a little
    for side in ("dense", "moe"):
        assert 0 < result["quality"][side]["val_loss"] < 1.5 * math.log(result["data"]["vocab"])
        assert result["quality"][side]["steps"] >= 1
    assert all(v > 0 for v in result["tokens_per_s"].values())
    assert "| training tokens/s |" in run.stdout
