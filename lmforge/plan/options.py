"""Reading the `lmforge plan` flags: token counts with suffixes, --parallel and --interconnect."""

from __future__ import annotations

from lmforge.errors import LmforgeError
from lmforge.plan.layout import Layout

SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_count(text: str, flag: str) -> int:
    """`4M` → 4,000,000; `100B` → 100,000,000,000; `1.5K` → 1500; plain integers too."""
    raw = text.strip().replace("_", "").replace(",", "")
    scale = SUFFIXES.get(raw[-1:].upper(), 1)
    number = raw[:-1] if scale > 1 else raw
    try:
        value = float(number) * scale
    except ValueError:
        raise LmforgeError(
            f"{flag} {text!r} is not a count: write e.g. 4M, 100B, 2.5K or 4096"
        ) from None
    if value <= 0 or value != value:
        raise LmforgeError(f"{flag} {text!r} must be positive")
    return round(value)


def parse_layout(text: str | None, gpus: int, sequence_parallel: bool = False) -> Layout:
    """`fsdp=8,tp=8` (also dp=, ep=, zero=0..3, sp=1); None: FSDP over every GPU."""
    if text is None:
        return Layout(fsdp=gpus)
    values: dict[str, int] = {}
    for item in text.split(","):
        key, sep, raw = item.strip().partition("=")
        if not sep or key not in ("dp", "fsdp", "tp", "ep", "zero", "sp") or not raw.isdigit():
            raise LmforgeError(
                f"--parallel item {item.strip()!r} is not NAME=INTEGER with NAME one of dp, fsdp, "
                "tp, ep, zero, sp: write e.g. --parallel fsdp=8,tp=8"
            )
        values[key] = int(raw)
    sp = bool(values.pop("sp", sequence_parallel))
    layout = Layout(**values, sp=sp)
    if layout.world_size != gpus:
        raise LmforgeError(
            f"--parallel {text} uses dp·fsdp·tp = {layout.world_size} GPUs but --gpus is {gpus}: "
            "make the product equal --gpus"
        )
    return layout


def parse_interconnect(text: str) -> tuple[str, str]:
    """`nvlink4,ib-ndr`: the link inside a node, then across nodes (one name: both)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if len(parts) not in (1, 2):
        raise LmforgeError(
            f"--interconnect {text!r}: give INTRA,INTER link names, e.g. nvlink4,ib-ndr"
        )
    return parts[0], parts[-1]
