"""The planner's quantized weight bytes against the bytes lmforge's quantized layers hold.

A batch-1 decode step reads every block matrix and the head once, so the bytes the planner
streams (plan/inference.py, `quantized_bytes_read`) must be the bytes of the quantized modules'
codes, scales and zeros plus the float head, exactly.
"""

import pytest
import torch

from lmforge.model import ModelConfig, Transformer
from lmforge.plan.inference import WEIGHT_BYTES, quantized_bytes_read, weight_bytes_read
from lmforge.plan.shapes import from_model_config
from lmforge.quant.linear import QuantizedLinear
from lmforge.quant.quantize import quantize_model
from lmforge.quant.schemes import quantize

CONFIG = ModelConfig(vocab_size=512, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=384)


def matmul_bytes(model: Transformer) -> int:
    """Bytes of every tensor of the blocks' linear layers and the head (not norms, embedding)."""
    total = model.output.weight.numel() * model.output.weight.element_size()
    for block in model.layers:
        for module in block.modules():
            if module is block or list(module.children()):
                continue
            if "norm" in type(module).__name__.lower():
                continue
            for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                total += t.numel() * t.element_size()
    return total


@pytest.mark.parametrize(("scheme", "group_size"), [("int8", None), ("int4", 128), ("int4", 64)])
def test_planned_bytes_are_the_quantized_modules_bytes(scheme, group_size):
    torch.manual_seed(0)
    model = Transformer(CONFIG)
    shape = from_model_config("t", CONFIG)
    fp32 = matmul_bytes(model)
    assert weight_bytes_read(shape, 1, WEIGHT_BYTES["fp32"]) == fp32
    _, group = quantize_model(model, scheme, group_size)
    measured = matmul_bytes(model)
    assert measured < fp32
    assert quantized_bytes_read(shape, scheme, group or 128) == measured
    head = QuantizedLinear.from_weight(quantize(model.output.weight, scheme, group))
    head_bytes = sum(t.numel() * t.element_size() for t in head.buffers())
    with_head = quantized_bytes_read(shape, scheme, group or 128, quantized_head=True)
    assert with_head == measured - model.output.weight.numel() * 4 + head_bytes
