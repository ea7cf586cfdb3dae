"""The report's expert-routing section: a histogram of the last routed step, none when dense."""

from lmforge.report.routing import routing_section


def test_the_last_routed_step_becomes_a_histogram():
    metrics = [
        {"step": 1, "loss": 5.0, "moe/counts": [1, 1, 1, 1]},
        {"step": 2, "loss": 4.0, "moe/counts": [60, 20, 20, 0], "moe/dropped": 0.05,
         "moe/aux_loss": 1.25, "moe/z_loss": 3.5, "moe/bias_drift": 0.002},
        {"step": 2, "final_val_loss": 4.1},
    ]  # fmt: skip
    lines = routing_section(metrics)
    text = "\n".join(lines)
    assert "at step 2" in text and "dropped 5.0%" in text and "aux loss 1.2500" in text
    rows = [line for line in lines if line.startswith("expert")]
    assert len(rows) == 4
    assert rows[0].endswith("2.40x " + "#" * 30)  # 60 of an even 25, the longest bar
    assert rows[1].endswith("0.80x " + "#" * 10)
    assert rows[3].endswith("0.00x ")  # an expert that took nothing


def test_a_dense_run_has_no_routing_section():
    assert routing_section([{"step": 1, "loss": 5.0}]) == []
