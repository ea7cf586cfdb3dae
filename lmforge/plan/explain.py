"""A plan's lines (value, unit, formula) and how they print: a table, with formulas, or JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass

UNITS = {  # unit -> (scale, suffix) ladders, largest first
    "B": [(2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B")],
    "params": [(1e9, "B"), (1e6, "M"), (1e3, "K"), (1, "")],
    "FLOP": [(1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1, "FLOP")],
    "FLOP/s": [(1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1, "FLOP/s")],
    "B/s": [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1, "B/s")],
    "tok/s": [(1e6, "M tok/s"), (1e3, "K tok/s"), (1, "tok/s")],
}


@dataclass(frozen=True)
class Line:
    key: str  # the JSON key
    label: str
    value: float | int | str
    unit: str = ""  # B, params, FLOP, FLOP/s, B/s, tok/s, s, %, or free text
    formula: str = ""  # the arithmetic, numbers substituted


Section = tuple[str, list[Line]]


def human(value: float | int | str, unit: str) -> str:
    if isinstance(value, str):
        return value
    if unit == "s":
        return _seconds(value)
    if unit == "%":
        return f"{value:.1%}"
    for scale, suffix in UNITS.get(unit, []):
        if abs(value) >= scale or scale == 1:
            exact = isinstance(value, int) and scale == 1
            number = f"{value:,}" if exact else f"{value / scale:,.2f}"
            return f"{number} {suffix}".rstrip()
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g} {unit}".rstrip()


def _seconds(s: float) -> str:
    for scale, suffix in ((86400, "days"), (3600, "h"), (60, "min"), (1, "s"), (1e-3, "ms")):
        if s >= scale:
            return f"{s / scale:.2f} {suffix}"
    return f"{s * 1e6:.1f} µs"


def render_text(sections: list[Section], explain: bool = False) -> str:
    out = []
    for title, lines in sections:
        out.append(title)
        width = max(len(line.label) for line in lines)
        for line in lines:
            out.append(f"  {line.label:<{width}}  {human(line.value, line.unit)}")
            if explain and line.formula:
                out.append(f"  {'':<{width}}    = {line.formula}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_json(sections: list[Section]) -> str:
    return json.dumps(
        {
            _key(title): {
                line.key: {"value": line.value, "unit": line.unit, "formula": line.formula}
                for line in lines
            }
            for title, lines in sections
        },
        indent=1,
    )


def _key(title: str) -> str:
    return title.split(":")[0].strip().lower().replace(" ", "_")
