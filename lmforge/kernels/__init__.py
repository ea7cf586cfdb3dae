"""Kernels below the model: FlashAttention-2 and fused linear + cross-entropy in plain PyTorch,
and their Triton versions (the `kernels` extra) for GPUs, each with the PyTorch reference it is
tested against; and the CPU decode kernels (C++, AVX-512 VNNI and AVX2) that read fp32, bf16, int8
and int4 weights at the memory's speed.
"""
