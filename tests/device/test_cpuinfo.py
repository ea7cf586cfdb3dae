"""CPU detection from what each OS says, on fixtures of every kind of machine we support."""

import dataclasses
from pathlib import Path

import pytest

from lmforge.device.capability import decode_isa
from lmforge.device.cpuinfo import cpu_class, normalise_arch, parse_proc_cpuinfo, parse_sysctl

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("fixture", "arch", "model", "machine_class", "has", "lacks"),
    [
        ("zen4.cpuinfo", "x86_64", "AMD EPYC 9R14 96-Core Processor", "avx512-bf16",
         {"avx2", "avx512f", "avx512_bf16"}, {"amx_bf16"}),
        ("zen3.cpuinfo", "x86_64", "AMD EPYC 7R13 Processor", "avx2",
         {"avx2", "fma"}, {"avx512f", "avx512_bf16"}),
        ("intel_laptop.cpuinfo", "x86_64", "12th Gen Intel(R) Core(TM) i7-1260P", "avx2",
         {"avx2", "avx_vnni"}, {"avx512f"}),
        ("graviton3.cpuinfo", "aarch64", "", "arm-bf16",
         {"asimd", "bf16", "i8mm", "sve"}, {"avx2"}),
        ("raspberry_pi4.cpuinfo", "aarch64", "BCM2835", "neon", {"asimd"}, {"bf16", "sve"}),
    ],
)  # fmt: skip
def test_proc_cpuinfo_of_each_machine(fixture, arch, model, machine_class, has, lacks):
    info = parse_proc_cpuinfo((FIXTURES / fixture).read_text(), arch)
    assert (info.arch, info.model) == (arch, model)
    assert has <= info.features
    assert not lacks & info.features
    assert cpu_class(info) == machine_class


def test_only_the_first_processor_is_read():
    info = parse_proc_cpuinfo((FIXTURES / "zen4.cpuinfo").read_text(), "x86_64")
    assert "avx512_vnni" in info.features  # the second processor's short list does not win


@pytest.mark.parametrize(
    ("fixture", "arch", "model", "machine_class", "has", "lacks"),
    [
        ("apple_m2.sysctl", "arm64", "Apple M2", "arm-bf16", {"asimd", "bf16", "i8mm"}, {"sme"}),
        ("apple_m1.sysctl", "arm64", "Apple M1", "neon", {"asimd", "asimddp"}, {"bf16"}),
        ("intel_mac.sysctl", "x86_64", "Intel(R) Core(TM) i9-9980HK CPU @ 2.40GHz", "avx2",
         {"avx2", "fma", "sse4_2"}, {"avx512f"}),
    ],
)  # fmt: skip
def test_macos_sysctl_of_each_machine(fixture, arch, model, machine_class, has, lacks):
    info = parse_sysctl((FIXTURES / fixture).read_text(), arch)
    assert (info.arch, info.model) == ("aarch64" if arch == "arm64" else arch, model)
    assert has <= info.features
    assert not lacks & info.features
    assert cpu_class(info) == machine_class


def test_architecture_names_are_normalised():
    assert normalise_arch("AMD64") == "x86_64"
    assert normalise_arch("arm64") == "aarch64"
    assert normalise_arch("riscv64") == "riscv64"


def test_an_empty_or_unknown_source_is_a_generic_cpu():
    assert cpu_class(parse_proc_cpuinfo("", "x86_64")) == "generic"
    assert cpu_class(parse_proc_cpuinfo("flags : avx2\n", "riscv64")) == "generic"
    assert parse_sysctl("garbage without separators", "arm64").features == frozenset()


@pytest.mark.parametrize(
    ("fixture", "arch", "isa"),
    [
        ("zen4.cpuinfo", "x86_64", "avx512"),
        ("zen3.cpuinfo", "x86_64", "avx2"),
        ("intel_laptop.cpuinfo", "x86_64", "avx2"),
        ("graviton3.cpuinfo", "aarch64", None),
    ],
)
def test_the_decode_kernels_instruction_set_of_each_machine(fixture, arch, isa):
    info = parse_proc_cpuinfo((FIXTURES / fixture).read_text(), arch)
    assert decode_isa(info) == isa


def test_avx512_without_vnni_takes_the_avx2_decode_kernels():
    """Skylake-SP has AVX-512 but not VNNI, which the AVX-512 integer kernels are built with."""
    zen4 = parse_proc_cpuinfo((FIXTURES / "zen4.cpuinfo").read_text(), "x86_64")
    skylake = dataclasses.replace(zen4, features=zen4.features - {"avx512_vnni"})
    assert decode_isa(skylake) == "avx2"
