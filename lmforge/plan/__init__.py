"""Planning a run on paper: parameters, FLOPs, memory, communication and inference speed.

Pure arithmetic over a `ModelShape`, a `Layout` and the hardware table; never imports torch nor
lmforge's configs (lmforge.planner_inputs turns presets, TOML configs and this machine's
measurements into the plain data the planner reads).
"""

from lmforge.plan.comm import comm_bytes_per_step
from lmforge.plan.layout import Layout
from lmforge.plan.shapes import ModelShape, from_model_config

__all__ = ["Layout", "ModelShape", "comm_bytes_per_step", "from_model_config"]
