"""The report's "plan vs measured" table: what `lmforge plan` predicts for the run's config on the
device it ran on, beside what the run measured (memory, tokens/s, MFU, communicated bytes).

The plan reads the device's matmul peak the way MFU does (the datasheet on a known GPU, the
cached measurement on a CPU: `cpu-local`), so building the table costs no new measurement.
"""

from __future__ import annotations

import sys

from lmforge.plan.comm import comm_bytes_per_step
from lmforge.plan.explain import human
from lmforge.plan.flops import training_flops_per_token
from lmforge.plan.layout import Layout
from lmforge.plan.memory import activation_bytes_per_layer, head_activation_bytes, state_bytes
from lmforge.plan.params import matmul_params
from lmforge.plan.precision import PRECISIONS, PrecisionBytes
from lmforge.plan.shapes import from_model_config

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ASSUMED_MFU = 0.4  # the planner's default


def run_precision(name: str, cast_module: bool) -> PrecisionBytes:
    """Autocast over fp32 weights (lmforge's default) keeps fp32 weights, gradients and moments
    and a fp32 residual stream; only matmuls and their outputs run in the low precision."""
    precision = PRECISIONS[name]
    if cast_module or name == "fp32":
        return precision
    return PrecisionBytes(f"{name} autocast", 4, 4, 0, activation=2, matmul=precision.matmul)


def plan_vs_measured(config_toml: str, training: dict, metrics: list[dict]) -> list[str]:
    """Markdown rows (with a heading and a note) comparing the plan with the run."""
    from lmforge.config import RunConfig, apply_dict
    from lmforge.device import pick_device
    from lmforge.train.mfu import peak_flops

    if "precision" not in training:
        return []
    cfg = apply_dict(RunConfig(), tomllib.loads(config_toml), source="config.toml", note=False)
    shape, tr = from_model_config(cfg.name, cfg.model), cfg.train
    # the run records Precision.describe(), e.g. "bf16 (cast module, fp32 master weights)"
    cast = tr.precision.cast_module
    precision = run_precision(training["precision"].split(" ", 1)[0], cast)
    residual = precision.activation if cast else 4
    per_layer = activation_bytes_per_layer(
        shape,
        tr.batch_size,
        tr.seq_len,
        tr.compute.activation_checkpointing,
        precision.activation,
        residual,
    )
    activations = shape.n_layers * per_layer
    activations += head_activation_bytes(shape, tr.batch_size, tr.seq_len, precision.activation)
    memory = state_bytes(shape, Layout(), precision).total + activations
    if precision.param > precision.activation:  # autocast keeps its low-precision weight copies
        memory += matmul_params(shape) * precision.activation
    device = pick_device(tr.device)
    peak = peak_flops(device, precision.matmul)
    tokens_per_s = ASSUMED_MFU * peak / training_flops_per_token(shape, tr.seq_len)
    comm = sum(comm_bytes_per_step(shape, Layout(), tr.batch_size, tr.seq_len).values())
    measured_comm = next(
        (m["comm_bytes_per_step"] for m in reversed(metrics) if "comm_bytes_per_step" in m), 0
    )
    rows = [
        ("peak memory", human(memory, "B"), human(training["peak_memory_bytes"], "B"),
         _ratio(training["peak_memory_bytes"], memory)),
        (f"tokens/s (plan at {ASSUMED_MFU:.0%} MFU)", f"{tokens_per_s:,.0f}",
         f"{training['tokens_per_s']:,.0f}", _ratio(training["tokens_per_s"], tokens_per_s)),
        ("MFU", f"{ASSUMED_MFU:.0%} (assumed)", f"{training['mfu']:.1%}",
         _ratio(training["mfu"], ASSUMED_MFU)),
        ("communicated bytes per step", human(comm, "B"), human(measured_comm, "B"),
         _ratio(measured_comm, comm)),
    ]  # fmt: skip
    where = "cpu-local" if device.type == "cpu" else device.type
    return [
        "### Plan vs measured",
        "",
        "| | plan | measured | measured / plan |",
        "|---|---|---|---|",
        *(f"| {' | '.join(row)} |" for row in rows),
        "",
        f"Plan: `lmforge plan` arithmetic for this config on {where} (matmul peak "
        f"{human(peak, 'FLOP/s')} in {precision.matmul}), one device, {precision.name}: weights, "
        "gradients and Adam moments, the activations saved for backward itemized per block, "
        "and under autocast the low-precision weight copies it keeps for backward.",
        "",
    ]


def _ratio(measured: float, planned: float) -> str:
    return f"{measured / planned:.2f}" if planned else "—"
