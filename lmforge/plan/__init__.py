"""Planning a run on paper: parameters, FLOPs, memory, communication and inference speed.

Pure arithmetic over a `ModelShape`, a `Layout` and the hardware table; torch is imported only to
measure `cpu-local` and to read lmforge's presets.
"""

from lmforge.plan.comm import comm_bytes_per_step
from lmforge.plan.layout import Layout
from lmforge.plan.shapes import ModelShape, from_model_config, resolve

__all__ = ["Layout", "ModelShape", "comm_bytes_per_step", "from_model_config", "resolve"]
