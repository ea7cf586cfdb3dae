"""benchmarks/bench_kernels.py runs on a CPU in its CI-size mode: the PyTorch paths only."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_kernel_benchmark_runs_on_cpu_in_quick_mode():
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py"), "--quick", "--reps", "1"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "linear_cross_entropy" in run.stdout and "attention" in run.stdout
    written = run.stdout.strip().splitlines()[-1].removeprefix("wrote ").strip()
    result = json.loads(Path(written).read_text())
    assert result["quick"] is True and "threads" in result  # the CPU side ran
