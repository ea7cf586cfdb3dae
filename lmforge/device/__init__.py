"""What the machine can do, asked in one place: which device to run on, which CPU kernels
work here and how fast (`capability`), and the peak FLOP/s MFU and the planner divide by."""

from lmforge.device.choice import pick_device

__all__ = ["pick_device"]
