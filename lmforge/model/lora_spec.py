"""LoRA's settings (`--lora r=8,alpha=16,...`): torch-free, so commands check them first."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from lmforge.errors import LmforgeError

TARGETS = {
    "q": "attn.q_proj",
    "k": "attn.k_proj",
    "v": "attn.v_proj",
    "o": "attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
"""Short target names (`--lora targets=q,v`) and the block modules they adapt. The Hugging Face
names (q_proj, gate_proj, ...) are accepted as well, as PEFT's `target_modules` spell them."""


@dataclass(frozen=True)
class LoraSpec:
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    # The attention projections: 0.44% of the 134M shape's parameters at r=8; all seven
    # projections would be 1.03% there.
    targets: tuple[str, ...] = ("q", "k", "v", "o")
    rslora: bool = False  # scaling α/√r (Kalajdzievski 2023) instead of α/r

    def __post_init__(self) -> None:
        given = {_short_target(t) for t in self.targets}
        object.__setattr__(self, "targets", tuple(t for t in TARGETS if t in given))
        if self.r < 1:
            raise LmforgeError(f"LoRA rank r must be at least 1, got {self.r}")
        if self.alpha <= 0:
            raise LmforgeError(f"LoRA alpha must be above 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise LmforgeError(f"LoRA dropout must be in [0, 1), got {self.dropout}")
        if not self.targets:
            raise LmforgeError(f"LoRA needs at least one target: choose from {', '.join(TARGETS)}")

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.r) if self.rslora else self.r)

    @classmethod
    def parse(cls, text: str) -> LoraSpec:
        """`r=8,alpha=16,dropout=0.05,targets=q,k,v,o,gate,up,down[,rslora=true]`: the names
        after `targets=` up to the next `key=` are its list."""
        values: dict[str, object] = {}
        key = None
        for part in (p.strip() for p in text.split(",") if p.strip()):
            if "=" in part:
                key, value = (s.strip() for s in part.split("=", 1))
                if key not in _FIELDS:
                    raise LmforgeError(
                        f"unknown LoRA setting {key!r} in {text!r}: use {', '.join(_FIELDS)}"
                    )
                values[key] = [value] if key == "targets" else value
            elif key == "targets":
                values["targets"].append(part)  # type: ignore[union-attr]
            else:
                raise LmforgeError(f"LoRA setting {part!r} in {text!r} has no '=': write key=value")
        try:
            return cls(
                r=int(values.get("r", 8)),
                alpha=float(values.get("alpha", 16.0)),
                dropout=float(values.get("dropout", 0.0)),
                targets=tuple(values.get("targets", cls.targets)),
                rslora=str(values.get("rslora", "false")).lower() in ("1", "true", "yes"),
            )
        except ValueError as e:
            raise LmforgeError(f"bad LoRA setting in {text!r} ({e}): r=8,alpha=16,...") from None

    def to_dict(self) -> dict:
        return {**asdict(self), "targets": list(self.targets)}


_FIELDS = tuple(LoraSpec.__dataclass_fields__)


def _short_target(name: str) -> str:
    short = name.removesuffix("_proj")
    if short not in TARGETS:
        raise LmforgeError(f"unknown LoRA target {name!r}: choose from {', '.join(TARGETS)}")
    return short
