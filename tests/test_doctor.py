"""`lmforge doctor`: the report says what was detected and which path each choice takes."""

import json
import os
import subprocess
import sys


def _doctor(*args, profile=None):
    env = {**os.environ, "LMFORGE_PROGRESS": "0"}
    env.pop("LMFORGE_CPU_PROFILE", None)
    if profile:
        env["LMFORGE_CPU_PROFILE"] = profile
    return subprocess.run(
        [sys.executable, "-m", "lmforge", "doctor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_doctor_prints_detection_kernels_and_choices():
    result = _doctor()
    assert result.returncode == 0, result.stderr
    for line in ("CPU", "ISA", "matmul GFLOP/s", "oneDNN packing", "int8 weight mm",
                 "decode kernels", "precision auto", "decode bf16, 8 slots", "torch.compile",
                 "code sandbox", "GPU"):  # fmt: skip
        assert f"\n{line} " in "\n" + result.stdout, line


def test_doctor_json_follows_a_forced_profile():
    facts = json.loads(_doctor("--json", profile="avx2").stdout)
    assert facts["cpu"]["profile"] == "avx2"
    assert facts["kernels"]["onednn_packing"]["bf16"] is False
    assert facts["choices"]["precision_auto"] == "fp32"
    assert facts["kernels"]["decode_kernels"] == "avx2"  # the widest the profile allows
    assert facts["choices"]["decode_layout"]["bf16, 8 slots"] == "avx2"
    assert facts["kernels"]["gflops"]["fp32"] > 0
    assert facts["sandbox"] == "bubblewrap" or facts["sandbox"].startswith("guard only")


def test_a_bad_profile_is_one_line_without_a_traceback():
    result = _doctor(profile="avx1024")
    assert result.returncode == 2
    assert result.stderr.startswith("error: unknown CPU profile 'avx1024'")
    assert "Traceback" not in result.stderr
