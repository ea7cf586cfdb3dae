"""The hardware table: devices (peak FLOP/s, memory, bandwidth) and links, from hardware.toml.

`cpu-local` is not in the file: it is measured on this machine (lmforge.planner_inputs, with
torch) and handed in as a `Device`; the planner itself never imports torch.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

from lmforge.errors import LmforgeError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

TABLE = Path(__file__).with_name("hardware.toml")
CPU_LOCAL = "cpu-local"


@dataclass(frozen=True)
class Device:
    key: str
    name: str
    flops: dict[str, float]  # dense peak FLOP/s per dtype
    memory_bytes: float
    memory_bandwidth: float  # bytes/s
    source: str

    def peak(self, dtype: str) -> float:
        if dtype not in self.flops:
            raise LmforgeError(
                f"{self.name} has no {dtype} peak in the hardware table: choose --precision "
                f"among {', '.join(self.flops)}"
            )
        return self.flops[dtype]


@dataclass(frozen=True)
class Link:
    key: str
    name: str
    bandwidth: float  # bytes/s per GPU and direction
    efficiency: float
    source: str

    @property
    def effective(self) -> float:
        return self.bandwidth * self.efficiency


@functools.cache
def _table() -> dict:
    return tomllib.loads(TABLE.read_text())


def device_names() -> list[str]:
    return [*_table()["devices"], CPU_LOCAL]


def link_names() -> list[str]:
    return list(_table()["links"])


def device(key: str) -> Device:
    if key == CPU_LOCAL:
        raise LmforgeError(
            "cpu-local is measured, not read from the table: use lmforge.planner_inputs.device"
        )
    entry = _table()["devices"].get(key)
    if entry is None:
        raise LmforgeError(
            f"--hardware {key!r} is unknown: choose one of {', '.join(device_names())}"
        )
    return Device(
        key,
        entry["name"],
        {k: float(v) for k, v in entry["flops"].items()},
        float(entry["memory_bytes"]),
        float(entry["memory_bandwidth"]),
        entry["source"],
    )


def link(key: str) -> Link:
    entry = _table()["links"].get(key)
    if entry is None:
        raise LmforgeError(
            f"--interconnect {key!r} is unknown: choose among {', '.join(link_names())}"
        )
    return Link(
        key, entry["name"], float(entry["bandwidth"]), float(entry["efficiency"]), entry["source"]
    )


def gpu_peaks() -> dict[str, dict[str, float]]:
    """Device-name substring → peak FLOP/s per dtype, longest substring first so that the most
    specific entry wins (`H100 PCIe` before `H100`, `L40S` before `L4`)."""
    peaks = {
        match: {k: float(v) for k, v in entry["flops"].items()}
        for entry in _table()["devices"].values()
        for match in entry["match"]
    }
    return dict(sorted(peaks.items(), key=lambda item: -len(item[0])))
