"""Training on many processes with torch.distributed: device mesh, DDP, FSDP2, tensor parallel.

Parallelism is applied to a plain model from outside (`parallelize.py`), like precision and
compile in train/compose.py. Importing this package is cheap: submodules import torch.distributed
only when used.
"""

from lmforge.parallel.layout import Layout, parse_layout

__all__ = ["Layout", "parse_layout"]
