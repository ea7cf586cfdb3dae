"""benchmarks/bench_llamacpp.py tries llama.cpp on each file in a child process first, and says
why it cannot decode one instead of crashing with it."""

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))  # where the benchmark imports bench_infer from

import bench_llamacpp  # noqa: E402

DECODES = "import sys; assert sys.argv[1].endswith('.gguf')"
CRASHES = (
    "import os, signal, sys\n"
    "if sys.argv[1].endswith('q8_0.gguf'): os.kill(os.getpid(), signal.SIGSEGV)"
)
FAILS = "import sys; sys.exit('error loading model: bad magic')"


def files(tmp_path: Path) -> dict[str, Path]:
    return {kind: tmp_path / f"model-{kind}.gguf" for kind in ("f32", "q8_0", "q4_0")}


def test_files_that_decode_pass(tmp_path):
    assert bench_llamacpp.decode_failure(files(tmp_path), DECODES) is None


def test_a_crash_names_the_file_type_and_the_signal(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_llamacpp, "llama_cpp_features", lambda: "AVX2 = 1 | AMX_INT8 = 1 |")
    failure = bench_llamacpp.decode_failure(files(tmp_path), CRASHES)
    assert failure.startswith(
        "llama.cpp cannot decode the q8_0 file on this CPU: it died of SIGSEGV"
    )
    assert "#20824" in failure and "-DGGML_AMX_INT8=OFF" in failure


def test_an_error_gives_its_last_line_and_no_amx_advice_without_amx(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_llamacpp, "llama_cpp_features", lambda: "AVX2 = 1 | AMX_INT8 = 0 |")
    failure = bench_llamacpp.decode_failure(files(tmp_path), FAILS)
    assert (
        failure
        == "llama.cpp cannot decode the f32 file on this CPU: error loading model: bad magic"
    )
