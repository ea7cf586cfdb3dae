import platform

import torch

from lmforge.model import ModelConfig, Transformer
from lmforge.train.compose import compose, keep_freed_memory
from lmforge.train.precision import make_precision


def test_cpu_training_keeps_freed_memory_under_glibc():
    cpu = torch.device("cpu")
    model = Transformer(ModelConfig(vocab_size=32, d_model=32, n_layers=1, n_heads=2))
    compose(model, make_precision("fp32", cpu), cpu)
    assert keep_freed_memory.cache_info().currsize == 1  # compose asked for it on a CPU
    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")
