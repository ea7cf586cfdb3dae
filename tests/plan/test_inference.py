"""Inference predictions against the real engine: KV cache bytes exactly, batch-1 decode time on
`cpu-local` within a stated factor.

The decode prediction is a roofline: every weight read once per token at the machine's read
bandwidth (a streaming sum, as `cpu-local` measures it). A real step also pays per-token
framework overhead (a few hundred small ops dispatched from Python, KV writes, sampling), and
single-row matmuls reach only part of a streaming read's bandwidth, so the measurement lies above
the prediction: 1.8-2.4× here, and the test accepts up to 4×. The model (59M parameters, 236 MB
of fp32 weights) is large enough that the weight read dominates that overhead. Both sides run on
one thread and are timed in CPU time, so other jobs sharing the machine's cores do not stretch
one side and not the other; attention runs on SDPA's math backend, since torch's fused CPU
kernel spends milliseconds on each single-query call.
"""

import time

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from lmforge.device.bandwidth import measure_read_bandwidth
from lmforge.infer.kv_cache import KVCache
from lmforge.infer.single_prompt import stream
from lmforge.model import ModelConfig, Transformer
from lmforge.plan.inference import decode_step, kv_bytes_per_token, max_batch, ridge_batch
from lmforge.plan.shapes import from_model_config
from lmforge.planner_inputs import resolve

FACTOR = 4.0


def fast_model(cfg: ModelConfig) -> Transformer:
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.02, 0.02)  # much faster than the truncated-normal init
    model.rope.reset_parameters()
    return model


def test_kv_bytes_equal_the_real_cache():
    cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=3, n_heads=8, n_kv_heads=2)
    cache = KVCache.for_model(Transformer(cfg), batch_size=1, max_seq_len=40)
    real = sum(t.numel() * t.element_size() for t in cache.k + cache.v)
    assert kv_bytes_per_token(from_model_config("t", cfg), kv_bytes=4) * 40 == real


def test_batch_one_decode_time_on_cpu_local_within_factor():
    cfg = ModelConfig(vocab_size=4096, d_model=1024, n_layers=4, n_heads=8, max_seq_len=64)
    model = fast_model(cfg)
    prompt, new = [1, 2, 3, 4], 12
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        steps, last = [], time.process_time()
        with sdpa_kernel(SDPBackend.MATH):
            for _ in stream(model, prompt, new, temperature=0.0):
                now = time.process_time()
                steps.append(now - last)
                last = now
        bandwidth = measure_read_bandwidth(time.process_time)
    finally:
        torch.set_num_threads(threads)
    measured = min(steps[1:])  # the first step is the prefill
    predicted = decode_step(
        from_model_config("t", cfg), 1, len(prompt) + new, 2e11, bandwidth, 4, 4
    )
    assert predicted.bound == "memory"
    assert 0.8 < measured / predicted.seconds < FACTOR  # 0.8: timing noise on the roofline


def test_decode_is_memory_bound_until_the_ridge_batch():
    shape = resolve("llama3-8b")
    peak, bw = 989.4e12, 3.35e12
    # At a short context: peak / bandwidth FLOPs per byte · 2 B per weight / 2 FLOPs per weight.
    assert ridge_batch(shape, 1, peak, bw) == pytest.approx(peak / bw, rel=0.01)
    ridge = ridge_batch(shape, 128, peak, bw)  # KV reads push it up
    assert decode_step(shape, int(ridge * 0.9), 128, peak, bw).bound == "memory"
    assert decode_step(shape, int(ridge * 1.1), 128, peak, bw).bound == "compute"
    assert ridge_batch(resolve("llama2-7b"), 8192, peak, bw) is None  # MHA: KV reads dominate


def test_max_batch_and_quantization():
    shape = resolve("llama3-70b")
    assert max_batch(shape, 8192, 80 * 2**30) == 0  # 141 GB of bf16 weights on one H100
    bf16 = decode_step(shape, 1, 1024, 8 * 989.4e12, 8 * 3.35e12, weight_bytes=2)
    int4 = decode_step(shape, 1, 1024, 8 * 989.4e12, 8 * 3.35e12, weight_bytes=0.5)
    assert int4.seconds == pytest.approx(bf16.seconds / 4, rel=0.05)
