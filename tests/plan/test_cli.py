"""`lmforge plan`: every preset plans (text and JSON); bad flags are one-line errors."""

import json
import shlex

import pytest

from lmforge.cli import main
from lmforge.planner_inputs import shape_names


@pytest.mark.parametrize("name", shape_names())
def test_every_preset_plans_as_json(name, capsys):
    assert (
        main(["plan", "--model", name, "--gpus", "8", "--parallel", "fsdp=4,tp=2", "--json"]) == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["parameters"]["total"]["value"] > 0
    assert plan["memory_per_device_(training)"]["total"]["unit"] == "B"
    assert plan["step_time"]["tokens_per_s"]["value"] > 0


def test_issue_example_with_explain(capsys):
    argv = shlex.split(
        "plan --model llama3-8b --hardware h100-sxm --gpus 64 --gpus-per-node 8 "
        "--interconnect nvlink4,ib-ndr --parallel fsdp=8,tp=8 --precision bf16 --seq-len 4096 "
        "--global-batch-tokens 4M --tokens 100B --activation-checkpointing full --explain"
    )
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "= 6·N + 12·L·d·s" in out
    assert "tp.all_reduce time over nvlink4" in out
    assert "fsdp.all_gather time over ib-ndr" in out
    assert "fits" in out


def test_config_file(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text('name = "mine"\n[model]\nd_model = 128\nn_layers = 3\nn_experts = 4\n')
    assert main(["plan", "--model", str(path), "--hardware", "a100-80gb", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"]["router"]["value"] == 3 * 128 * 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "nope"], "neither a preset nor a TOML config"),
        (["--model", "tiny", "--gpus", "8", "--parallel", "fsdp=2"], "make the product equal"),
        (["--model", "tiny", "--gpus", "8", "--parallel", "tp=8"], "does not divide the 4 heads"),
        (["--model", "tiny", "--parallel", "pp=1"], "not NAME=INTEGER"),
        (["--model", "tiny", "--hardware", "tpu"], "--hardware 'tpu' is unknown"),
        (["--model", "tiny", "--interconnect", "nvlink9"], "--interconnect 'nvlink9'"),
        (["--model", "tiny", "--tokens", "lots"], "is not a count"),
        (["--model", "tiny", "--precision", "int3"], "--precision 'int3'"),
        (["--model", "tiny", "--activation-checkpointing", "some"], "choose none, full"),
        (["--model", "tiny", "--hardware", "a100-80gb", "--precision", "fp8"], "no fp8 peak"),
    ],
)
def test_bad_flags_are_one_line_errors(argv, message, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_inference_plan_has_no_training_sections_and_labels_weight_memory(capsys):
    argv = ["plan", "--model", "llama3-8b", "--gpus", "8", "--parallel", "tp=8", "--inference"]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert list(plan) == ["setup", "parameters", "inference_on_8_×_h100-sxm"]
    lines = plan["inference_on_8_×_h100-sxm"]
    total, per_device = lines["bf16.weights"]["value"], lines["bf16.weights_per_device"]["value"]
    assert per_device == pytest.approx(total / 8)
    assert main(argv) == 0
    assert "[bf16 weights] weight memory, all 8 devices" in capsys.readouterr().out


def test_default_token_budget_is_stated_without_explain(capsys):
    assert main(["plan", "--model", "small"]) == 0
    assert "run tokens (default: 20 per active parameter)" in capsys.readouterr().out
    assert main(["plan", "--model", "small", "--tokens", "1M"]) == 0
    assert "default: 20 per active parameter" not in capsys.readouterr().out


@pytest.mark.parametrize(("fast", "expected"), [(True, "bf16"), (False, "fp32")])
def test_cpu_local_precision_defaults_to_what_auto_picks(fast, expected, monkeypatch):
    import lmforge.device.capability as capability
    from lmforge.planner_inputs import default_precision

    class Capability:
        def fast_bf16(self):
            return fast

    monkeypatch.setattr(capability, "cpu_capability", Capability)
    assert default_precision("cpu-local")[0] == expected
    assert default_precision("h100-sxm") == ("bf16", "")
