"""The report's plan-vs-measured table."""

from lmforge.config import apply_override, config_text, tiny
from lmforge.report.plan_table import plan_vs_measured, run_precision

TRAINING = {"tokens_per_s": 5000.0, "precision": "fp32", "mfu": 0.2, "peak_memory_bytes": 2**22}


def test_table_has_the_four_quantities_and_reads_logged_comm_bytes():
    rows = plan_vs_measured(config_text(tiny()), TRAINING, [{"comm_bytes_per_step": 2048}])
    text = "\n".join(rows)
    assert rows[0] == "### Plan vs measured"
    assert "| peak memory | " in text
    assert "| tokens/s (plan at 40% MFU) | " in text and "| 5,000 |" in text
    assert "| MFU | 40% (assumed) | 20.0% | 0.50 |" in text
    assert "| communicated bytes per step | 0 B | 2.00 KiB | — |" in text


def test_no_table_without_training_numbers():
    assert plan_vs_measured(config_text(tiny()), {}, []) == []


def test_autocast_keeps_fp32_state():
    autocast = run_precision("bf16", cast_module=False)
    assert (autocast.param, autocast.grad, autocast.optimizer, autocast.activation) == (4, 4, 8, 2)
    assert run_precision("bf16", cast_module=True).optimizer == 12


def test_a_precision_described_with_its_details_is_planned_by_its_name():
    cast = apply_override(tiny(), "train.precision.cast_module=true")
    cast = apply_override(cast, "train.precision.dtype=bf16")
    training = {**TRAINING, "precision": "bf16 (cast module, fp32 master weights)"}
    assert "| peak memory | " in "\n".join(plan_vs_measured(config_text(cast), training, []))
    fp8 = {**TRAINING, "precision": "fp8 (simulated, bf16 matmuls)"}
    assert plan_vs_measured(config_text(tiny()), fp8, [])[0] == "### Plan vs measured"
