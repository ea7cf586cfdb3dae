"""Bytes per parameter, gradient, optimizer state and activation under each training precision.

Mixed precision (bf16, fp16, fp8) follows the ZeRO paper's accounting: 2-byte weights and
gradients, plus an fp32 master copy and Adam's two fp32 moments (2 + 2 + 12 = 16 bytes per
parameter); fp32 keeps 4-byte weights and gradients and the two moments (4 + 4 + 8). fp8 runs
its matmuls in fp8 but stores weights, gradients and activations in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.errors import LmforgeError


@dataclass(frozen=True)
class PrecisionBytes:
    name: str
    param: int
    grad: int
    master: int  # the fp32 copy the optimizer steps (0 when the weights already are fp32)
    adam: int = 8  # exp_avg and exp_avg_sq in fp32
    activation: int = 2
    matmul: str = "bf16"  # the peak FLOP/s column compute time is measured against

    @property
    def optimizer(self) -> int:
        return self.master + self.adam


PRECISIONS = {
    "fp32": PrecisionBytes("fp32", param=4, grad=4, master=0, activation=4, matmul="fp32"),
    "bf16": PrecisionBytes("bf16", param=2, grad=2, master=4),
    "fp16": PrecisionBytes("fp16", param=2, grad=2, master=4, matmul="fp16"),
    "fp8": PrecisionBytes("fp8", param=2, grad=2, master=4, matmul="fp8"),
}


def precision_bytes(name: str) -> PrecisionBytes:
    if name not in PRECISIONS:
        raise LmforgeError(
            f"--precision {name!r} is unknown: choose one of {', '.join(PRECISIONS)}"
        )
    return PRECISIONS[name]
