import json

import pytest

from lmforge.report import ReportData, Sample, write_report
from lmforge.report.report import baseline_warning, render, warn_if_behind_baseline


def test_report_has_numbers_plot_and_samples(tmp_path):
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for step in range(10, 110, 10):
            f.write(
                json.dumps({"step": step, "loss": 8 - step / 20, "lr": 1e-3, "tokens_per_s": 1})
            )
            f.write("\n")
        f.write(json.dumps({"step": 100, "val_loss": 3.5, "val_bpb": 1.2}) + "\n")
    data = _data({"val_loss": 3.5, "val_bpb": 1.2, "unigram_bpb": 2.4})
    path = write_report(tmp_path, data)
    text = path.read_text()
    assert "| final evaluation: validation bits per byte | **1.2000** |" in text
    assert "| unigram baseline bits per byte | 2.4000 |" in text
    assert "2.00× fewer bits" in text
    assert "| exact duplicates removed | 1 |" in text
    assert "| near duplicates removed (MinHash) | 2 |" in text
    assert "| PII masked | 5 (email 4, ipv4 1) |" in text
    assert "3.25 bytes per token" in text
    assert "| bf16 | 83 | 41.0% | 1.5 MB | 2 |" in text
    assert "def f(x):\n    return x" in text
    assert "![loss curve](plots/loss.png)" in text
    png = (tmp_path / "plots" / "loss.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    assert "Warning" not in text


def _data(evaluation):
    return ReportData(
        name="t",
        config_toml="[train]\nlr = 0.001\n",
        data_stats={
            "source": "x",
            "files": 3,
            "skipped_not_utf8": 1,
            "documents_in": 3,
            "bytes_in": 10,
            "duplicates_removed": 1,
            "near_duplicates_removed": 2,
            "pii_masked": {"email": 4, "ipv4": 1},
            "documents": {"train": 1, "val": 1},
            "tokens": {"train": 1000, "val": 100},
        },
        tokenizer={"vocab_size": 512, "bytes_per_token": 3.25},
        model={"parameters": 1_500_000, "shape": "2 layers"},
        training={
            "steps": 100,
            "seconds": 60,
            "tokens": 5000,
            "tokens_per_s": 83.3,
            "precision": "bf16",
            "mfu": 0.41,
            "peak_memory_bytes": 3 * 2**19,
            "skipped_steps": 2,
        },
        evaluation=evaluation,
        samples=[Sample("def ", "f(x):\n    return x")],
    )


def _render(evaluation):
    text = render(_data(evaluation), "plots/loss.png")
    return text[: text.index("## Data")]


def test_a_model_worse_than_unigram_is_flagged_not_praised():
    result = _render({"val_loss": 5.0, "val_bpb": 2.5, "unigram_bpb": 2.4})
    assert "> **Warning: the model does not beat the unigram baseline (2.5000 vs 2.4000" in result
    assert "| improvement over unigram | none (0.96×) |" in result
    assert "fewer bits" not in result


def test_final_and_periodic_evaluations_are_labelled_apart():
    evaluation = {"val_loss": 3.5, "val_bpb": 1.2, "unigram_bpb": 2.4, "batches": 64}
    evaluation |= {"windows": 512, "seq_len": 256, "tokens": 130_000}
    evaluation |= {"periodic_val_bpb": 1.25, "periodic_batches": 16}
    result = _render(evaluation)
    assert "| final evaluation: validation bits per byte | **1.2000** |" in result
    assert (
        "| periodic validation bits per byte, last (`val_bpb` in metrics.jsonl) | 1.2500 |"
        in result
    )
    assert "The final evaluation read 64 batches (512 windows of 256 tokens, 130,000" in result
    assert "`final_val_loss` and `final_val_bpb` in metrics.jsonl" in result
    assert "reads 16 batches (`train.eval.batches`)" in result


@pytest.mark.parametrize("val_bpb,warned", [(2.4, True), (2.5, True), (2.39, False)])
def test_the_console_is_warned_of_a_run_behind_the_baseline(val_bpb, warned, capsys):
    assert (baseline_warning(val_bpb, 2.4) is not None) == warned
    warn_if_behind_baseline(val_bpb, 2.4)
    err = capsys.readouterr().err
    assert err.startswith("warning: the model does not beat the unigram baseline") == warned
    assert err.count("\n") == warned


def test_a_sized_run_names_its_shape_and_why_and_a_busy_machine_is_said_to_be(tmp_path):
    import dataclasses

    from lmforge.recipe.sizing import Candidate, Sizing

    sizing = Sizing("d256-l4", 480.0, 21.0, 7.65, 2_900_000, [
        Candidate("d192-l4", 2_600_000, 7000.0, 1.52, 7400.0, 1.50),
        Candidate("d256-l4", 4_300_000, 5000.0, 1.48, 6300.0, 1.45),
        Candidate("d512-l8", 27_800_000, 900.0, 1.90),
    ])  # fmt: skip
    busy = {"calibrated_tokens_per_s": 6300.0, "tokens_per_s": 3100.0, "others_cpu_share": 0.6}
    data = dataclasses.replace(
        _data({"val_loss": 3.5, "val_bpb": 1.2, "unigram_bpb": 2.4}),
        sizing={**dataclasses.asdict(sizing), "reason": sizing.reason},
        machine_load=busy,
    )
    text = render(data, "plots/loss.png")
    assert "Chosen: d256-l4. Why: d256-l4 (4.3M parameters) has the lowest predicted bpb" in text
    assert "| d512-l8 | 27.8M | 900 | - | 1.900 |" in text  # predicted only: not timed
    assert "| d256-l4 | 4.3M | 5,000 | 6,300 | 1.450 |" in text
    assert "**The machine was busy** while training: other processes used 60% of its CPUs" in text
    assert "3,100 tokens/s, 49% of the 6,300 tokens/s timed before it" in text
    quiet = dataclasses.replace(data, machine_load={**busy, "others_cpu_share": 0.02})
    assert "The machine was quiet while training" in render(quiet, "plots/loss.png")
