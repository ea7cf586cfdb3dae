"""Kernels below the model: FlashAttention-2 and fused linear + cross-entropy in plain PyTorch,
and their Triton versions (the `kernels` extra) for GPUs, each with the PyTorch reference it is
tested against.
"""
