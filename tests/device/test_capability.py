"""The CPU capability module: probes that agree with the kernels, profiles that force every
fallback on any machine, and the choices that ask it."""

import os
import subprocess
import sys
import warnings

import pytest
import torch

import lmforge.device.capability as capability
from lmforge.device.capability import (
    PROFILES,
    cpu_capability,
    detect,
    profile_capability,
    use_compile,
)
from lmforge.errors import LmforgeError
from lmforge.infer.weight_layouts import decode_layout

FP32, BF16 = torch.empty(1, 1), torch.empty(1, 1, dtype=torch.bfloat16)
# What each class of machine decodes with: (dtype, slots, compiled) -> layout.
LAYOUTS = {
    "avx512-bf16": {"bf16 8": "packed", "bf16 1": "packed", "fp32 8": "packed"},
    "avx512": {"bf16 8": "packed", "bf16 1": "packed", "fp32 8": "packed"},
    "avx2": {"bf16 8": "row-major", "bf16 1": "row-major", "fp32 8": "packed"},
    "arm-bf16": {"bf16 8": "packed", "bf16 1": "packed", "fp32 8": "packed"},
    "neon": {"bf16 8": "row-major", "bf16 1": "row-major", "fp32 8": "packed"},
    "generic": {"bf16 8": "row-major", "bf16 1": "row-major", "fp32 8": "row-major"},
}


@pytest.mark.parametrize("profile", PROFILES)
def test_decode_layout_for_every_class_of_machine(profile):
    cap = profile_capability(profile)
    for case, want in LAYOUTS[profile].items():
        dtype, slots = case.split()
        weight = BF16 if dtype == "bf16" else FP32
        assert decode_layout(weight, int(slots), capability=cap) == want, case
    # the layouts that need no oneDNN are the same everywhere
    assert decode_layout(FP32, 1, capability=cap) == "column-major"
    assert decode_layout(BF16, 2, compiled=True, capability=cap) == "streamed"


def test_probes_agree_with_the_kernels_on_this_cpu():
    cap = detect()
    weight = torch.randn(8, 16, dtype=torch.bfloat16)
    if cap.can_pack(torch.bfloat16):
        torch.ops.mkldnn._reorder_linear_weight(weight, 2)
    elif torch.backends.mkldnn.is_available() and cap.arch == "x86_64":
        with pytest.raises(RuntimeError):
            torch.ops.mkldnn._reorder_linear_weight(weight, 2)
    assert cap.can_pack(torch.float32) == capability.probe_packing(torch.float32)
    assert cap.int8_weight_mm == capability.probe_int8_weight_mm()


@pytest.mark.parametrize("profile", PROFILES)
def test_a_forced_profile_only_takes_capabilities_away(monkeypatch, profile):
    monkeypatch.setenv("LMFORGE_CPU_PROFILE", profile)
    forced, detected = cpu_capability(), detect()
    assert forced.profile == profile
    assert forced.packed_dtypes <= detected.packed_dtypes & PROFILES[profile].packed_dtypes
    assert forced.int8_weight_mm <= detected.int8_weight_mm
    assert forced.bf16_allowed == PROFILES[profile].bf16
    assert (forced.arch, forced.isa, forced.features) == (
        detected.arch,
        detected.isa,
        detected.features,
    )


def test_an_unknown_profile_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("LMFORGE_CPU_PROFILE", "avx1024")
    with pytest.raises(LmforgeError, match="unknown CPU profile 'avx1024'.*choose one of"):
        cpu_capability()


def test_without_a_compiler_compile_falls_back_to_eager(monkeypatch):
    monkeypatch.setattr(capability, "cpp_compiler", lambda: None)
    with pytest.warns(UserWarning, match="needs a C\\+\\+ compiler.*eagerly"):
        assert use_compile(True, "cpu") is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert use_compile(False, "cpu") is False  # nothing asked, nothing said
        assert use_compile(True, "meta") is True


def test_the_compiler_is_the_one_inductor_uses(monkeypatch):
    """$CXX when set, checked by running it: the name Inductor's config takes, found without
    importing Inductor."""
    from torch._inductor import config

    monkeypatch.delenv("CXX", raising=False)
    capability.cpp_compiler.cache_clear()
    try:
        assert capability.cpp_compiler() in (None, *filter(None, config.cpp.cxx))
        monkeypatch.setenv("CXX", sys.executable)  # runs, so it counts as found
        capability.cpp_compiler.cache_clear()
        assert capability.cpp_compiler() == sys.executable
        monkeypatch.setenv("CXX", "/nonexistent/c++")
        capability.cpp_compiler.cache_clear()
        assert capability.cpp_compiler() is None
    finally:
        capability.cpp_compiler.cache_clear()


def test_off_glibc_the_allocator_is_left_alone(monkeypatch):
    from lmforge.train import compose

    monkeypatch.setattr(compose, "cpu_capability", lambda: profile_capability("generic"))
    assert profile_capability("generic").glibc is False
    assert compose.keep_freed_memory.__wrapped__() is False


AVX2_HOST = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
AVX2_SCRIPT = """
import torch
from lmforge.device.capability import detect
from lmforge.infer.engine import Engine, SamplingParams
from lmforge.model import ModelConfig, Transformer


class ByteTokenizer:
    special_tokens = {"<|endoftext|>": 256}

    def token_bytes(self, token):
        return bytes([token]) if token < 256 else b"<|endoftext|>"


cap = detect()
assert cap.isa == "AVX2", cap.isa
assert cap.packed_dtypes == {torch.float32}, cap.packed_dtypes
torch.manual_seed(0)
model = Transformer(ModelConfig(vocab_size=257, d_model=32, n_layers=2, n_heads=4)).bfloat16()
prompts, params = [[1, 2, 3], [4, 5], [6], [7, 8]], SamplingParams(max_tokens=6, temperature=0)
with Engine(model, ByteTokenizer(), max_batch_size=4) as engine:
    want = [c.token_ids for c in engine.generate(prompts, params)]
# 16 slots: beyond lmforge's decode kernels (8 rows), where oneDNN's packing would serve
relaid = Engine(model, ByteTokenizer(), max_batch_size=16, relayout_weights=True)
with relaid:
    got = [c.token_ids for c in relaid.generate(prompts, params)]
assert relaid.weight_layout == "row-major", relaid.weight_layout
assert got == want
print("ok")
"""


def test_on_an_avx2_only_cpu_bf16_engines_fall_back_to_the_plain_layout():
    """oneDNN and ATen capped at AVX2 behave as on an AVX2-only host: bf16 packing raises
    there, so a 16-slot bf16 engine must take the plain layout and give the same tokens."""
    env = {**os.environ, **AVX2_HOST}
    env.pop("LMFORGE_CPU_PROFILE", None)
    result = subprocess.run(
        [sys.executable, "-c", AVX2_SCRIPT], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
