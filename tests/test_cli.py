"""The CLI end to end: its surface, the speedrun, generate and eval, and user errors."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lmforge.cli import build_parser, main

# Scripts rely on these spellings; change them only on purpose.
SURFACE = {
    "doctor": {"--json"},
    "export": {"--checkpoint", "--format", "--out", "--type"},
    "import": {"--from", "--out"},
    "quantize": {
        "--checkpoint",
        "--scheme",
        "--group-size",
        "--method",
        "--calibration",
        "--calibration-sequences",
        "--quantize-head",
        "--out",
    },
    "speedrun": {
        "--preset",
        "--config",
        "--set",
        "--minutes",
        "--data",
        "--doc-separator",
        "--chat",
        "--precision",
        "--activation-checkpointing",
        "--compile",
        "--threads",
        "--out",
        "--fresh",
    },
    "tokenizer train": {
        "--input",
        "--vocab-size",
        "--special-token",
        "--pattern",
        "--out",
        "--workers",
        "--invalid-utf8",
        "--doc-separator",
    },
    "tokenizer stats": {"--tokenizer", "--input"},
    "tokenize": {
        "--tokenizer",
        "--input",
        "--out",
        "--val-fraction",
        "--workers",
        "--doc-separator",
    },
    "train": {
        "--preset",
        "--config",
        "--set",
        "--data",
        "--doc-separator",
        "--max-steps",
        "--minutes",
        "--seed",
        "--device",
        "--parallel",
        "--precision",
        "--activation-checkpointing",
        "--compile",
        "--threads",
        "--out",
        "--fresh",
    },
    "generate": {
        "--checkpoint",
        "--adapter",
        "--prompt",
        "--prompts-file",
        "--max-new-tokens",
        "--temperature",
        "--top-k",
        "--top-p",
        "--min-p",
        "--repetition-penalty",
        "--frequency-penalty",
        "--presence-penalty",
        "--stop",
        "--seed",
        "--logprobs",
        "--beams",
        "--length-penalty",
        "--batch-size",
        "--compile",
        "--speculative",
        "--device",
    },
    "eval": {
        "--checkpoint",
        "--tasks",
        "--limit",
        "--num-fewshot",
        "--batch-size",
        "--out",
        "--harness",
        "--data",
        "--max-batches",
        "--device",
    },
    "serve": {
        "--checkpoint",
        "--adapter",
        "--host",
        "--port",
        "--max-batch-size",
        "--model-name",
        "--compile",
        "--speculative",
        "--device",
        "--api-key",
        "--max-body-bytes",
        "--max-prompt-tokens",
        "--max-tokens",
        "--max-queue",
        "--shutdown-timeout",
    },
    "chat": {
        "--checkpoint",
        "--adapter",
        "--max-tokens",
        "--temperature",
        "--top-p",
        "--seed",
        "--system",
        "--compile",
        "--device",
    },
    "sft": {
        "--checkpoint",
        "--data",
        "--val-data",
        "--val-fraction",
        "--epochs",
        "--lora",
        "--config",
        "--set",
        "--max-steps",
        "--minutes",
        "--seed",
        "--device",
        "--parallel",
        "--precision",
        "--activation-checkpointing",
        "--compile",
        "--threads",
        "--out",
        "--fresh",
    },
    "rl": {
        "--checkpoint",
        "--task",
        "--group-size",
        "--prompts-per-step",
        "--steps",
        "--minutes",
        "--lr",
        "--num-iterations",
        "--max-new-tokens",
        "--temperature",
        "--top-k",
        "--scale-rewards",
        "--loss-norm",
        "--beta",
        "--dynamic-sampling",
        "--lora",
        "--set",
        "--seed",
        "--device",
        "--precision",
        "--threads",
        "--parallel",
        "--out",
        "--fresh",
    },
    "data run": {
        "--config",
        "--input",
        "--output",
        "--steps",
        "--workers",
        "--executor",
        "--address",
        "--set",
    },
    "data train-classifier": {"--positive", "--negative", "--out"},
    "bench comm": {"--sizes", "--ops", "--iters", "--warmup", "--device", "--json"},
    "plan": {
        "--model",
        "--hardware",
        "--gpus",
        "--gpus-per-node",
        "--interconnect",
        "--parallel",
        "--precision",
        "--seq-len",
        "--global-batch-tokens",
        "--tokens",
        "--activation-checkpointing",
        "--micro-batch",
        "--mfu",
        "--explain",
        "--inference",
        "--json",
    },
}


def _commands(parser, prefix=""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix}{name} ")
    options = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    if prefix:
        yield prefix.strip(), options - {"--help"}


def test_cli_surface_is_pinned():
    groups = ("tokenizer", "data", "bench")
    found = {name: opts for name, opts in _commands(build_parser()) if name not in groups}
    assert found == SURFACE


@pytest.mark.parametrize("command", [[], *[c.split() for c in SURFACE]])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: lmforge" in out
    for option in SURFACE.get(" ".join(command), ()):
        assert option in out


def _run(*args, cwd=None, env=None):
    env = {**os.environ, "LMFORGE_PROGRESS": "0", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "lmforge", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def _speedrun(corpus_dir, out, env=None):
    settings = ["--set", "train.max_steps=60", "--set", "data.val_fraction=0.1"]
    settings += ["--set", "train.eval.every=30", "--set", "train.eval.tasks=code"]
    return _run(
        "speedrun", "--preset", "tiny", "--data", corpus_dir, "--out", out, *settings, env=env
    )


@pytest.fixture(scope="module")
def speedrun_dir(corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    result = _speedrun(corpus_dir, out)
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_speedrun_writes_a_complete_run_folder(speedrun_dir):
    out, stdout = speedrun_dir
    report = (out / "report.md").read_text()
    for heading in ("## Result", "## Data", "## Tokenizer", "## Training", "## Samples"):
        assert heading in report
    assert "| precision | tokens/s | MFU | peak memory | skipped steps |" in report
    assert (out / "plots" / "loss.png").stat().st_size > 5000
    assert (out / "config.toml").read_text().startswith('name = "tiny"')
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0]
    logs = [r for r in records if "loss" in r]
    assert all({"tokens_per_s", "step_time_s", "mfu", "peak_memory_mb"} <= set(r) for r in logs)
    assert (out / "checkpoints" / "step_60" / "model.safetensors").exists()
    scored = [r for r in records if "task_code_next_line" in r]  # train.eval.tasks=code
    assert [r["step"] for r in scored] == [30, 60]
    assert all(0 <= r["task_code_closing"] <= 1 for r in scored)
    for stage in ("documents:", "tokenizer:", "tokens:", "evaluation:", "tasks:", "report:"):
        assert stage in stdout


def test_speedrun_rerun_reuses_every_stage(speedrun_dir, corpus_dir):
    out, _ = speedrun_dir
    result = _speedrun(corpus_dir, out, env={"LMFORGE_PROGRESS": "1"})
    assert result.returncode == 0, result.stderr
    for stage in (
        "documents: reusing",
        "tokenizer: reusing",
        "tokens: reusing",
        "training: reusing",
    ):
        assert stage in result.stdout
    bars = result.stderr.splitlines()
    for shown in ("validation:", "final evaluation:", "samples:", "report:"):
        assert any(line.startswith(f"{shown} 100%") for line in bars), shown


AVX2_HOST = {  # oneDNN and ATen capped as on an AVX2-only CPU; Inductor's cache kept apart
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "TORCHINDUCTOR_CACHE_DIR": str(Path(tempfile.gettempdir()) / "lmforge-inductor-avx2"),
}


def test_generate_on_bf16_and_fp32_checkpoints_on_every_cpu(speedrun_dir, tmp_path):
    """A bf16 checkpoint decodes in bf16 where bf16 is fast and in fp32 elsewhere; with four
    prompts in one batch the engine takes its multi-slot layout, which on an AVX2-only CPU must
    not ask oneDNN to pack bf16 weights."""
    from safetensors.torch import load_file, save_file

    out, _ = speedrun_dir
    fp32 = sorted((out / "checkpoints").iterdir())[-1]
    bf16 = tmp_path / "bf16"
    shutil.copytree(fp32, bf16)
    weights = load_file(bf16 / "model.safetensors")
    save_file({k: v.bfloat16() for k, v in weights.items()}, bf16 / "model.safetensors")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def main(\nimport os\nclass A:\nfor i in\n")
    for name, checkpoint, env in [("bf16", bf16, {}), ("bf16 avx2", bf16, AVX2_HOST),
                                  ("fp32 avx2", fp32, AVX2_HOST)]:  # fmt: skip
        result = _run(
            "generate", "--checkpoint", checkpoint, "--prompts-file", prompts,
            "--max-new-tokens", 8, "--temperature", 0, "--batch-size", 4, env=env,
        )  # fmt: skip
        assert result.returncode == 0, f"{name}: {result.stderr[-2000:]}"
        rows = [json.loads(line) for line in result.stdout.splitlines()]
        assert [r["prompt"] for r in rows] == ["def main(", "import os", "class A:", "for i in"]
        assert all(r["tokens"] >= 1 for r in rows), name


def test_generate_continues_the_prompt(speedrun_dir):
    out, _ = speedrun_dir
    result = _run(
        "generate",
        "--checkpoint",
        out,
        "--prompt",
        "def main(",
        "--max-new-tokens",
        20,
        "--seed",
        1,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("def main(") and len(result.stdout) > len("def main(\n")
    again = _run(
        "generate",
        "--checkpoint",
        out,
        "--prompt",
        "def main(",
        "--max-new-tokens",
        20,
        "--seed",
        1,
    )
    assert again.stdout == result.stdout  # seeded sampling is reproducible


def test_eval_on_documents_and_on_shards_agree(speedrun_dir, corpus_dir, capsys):
    out, _ = speedrun_dir

    def result_line(data):  # the last line; the first says what was evaluated
        assert main(["eval", "--checkpoint", str(out), "--data", str(data)]) == 0
        return capsys.readouterr().out.splitlines()[-1]

    on_docs = result_line(out / "data" / "val.jsonl")
    assert "bits/byte" in on_docs
    assert on_docs == result_line(out / "tokens")  # the same held-out documents either way
    assert "bits/byte" in result_line(corpus_dir)  # before cleaning: the same split


def test_the_report_shows_the_code_suite_and_lmforge_eval_reproduces_it(speedrun_dir, tmp_path):
    out, _ = speedrun_dir
    report = (out / "report.md").read_text()
    summary = json.loads((out / "eval" / "summary.json").read_text())
    assert "## Tasks: the code suite" in report and "CORE-style aggregate" in report
    names = [t["task"] for t in summary["tasks"]]
    assert names == ["code_next_line", "code_identifier", "code_closing"]
    for task in summary["tasks"]:
        assert task["examples"] > 0 and 0 <= task["contamination"] <= 1
        assert f"| {task['task']} ({task['examples']}) |" in report
        assert (out / "eval" / f"{task['task']}.jsonl").exists()
    result = _run("eval", "--checkpoint", out, "--tasks", "code", "--out", tmp_path / "again")
    assert result.returncode == 0, result.stderr
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    for mine, theirs in zip(again["tasks"], summary["tasks"], strict=True):
        # the same examples and scores; float sums may differ in the last bits (other threads)
        assert mine["examples"] == theirs["examples"]
        assert mine["contamination"] == theirs["contamination"]
        assert mine["metrics"] == pytest.approx(theirs["metrics"], rel=1e-6, nan_ok=True)
        assert [r["prompt"] for r in mine["failures"]] == [r["prompt"] for r in theirs["failures"]]
    assert again["code_suite_aggregate"] == pytest.approx(summary["code_suite_aggregate"])
    assert "code_next_line: acc" in result.stdout


def test_eval_task_errors_are_one_line(speedrun_dir, tmp_path):
    out, _ = speedrun_dir
    result = _run("eval", "--checkpoint", out, "--tasks", "nosuch")
    assert result.returncode == 2 and "unknown task 'nosuch'" in result.stderr
    assert "Traceback" not in result.stderr


def test_python_api_loads_a_checkpoint(speedrun_dir):
    import torch

    import lmforge

    out, _ = speedrun_dir
    model, tokenizer = lmforge.load(out)
    ids = torch.tensor([tokenizer.encode_ordinary("import os\nimport sys\n")])
    logits = model(ids)
    assert logits.shape == (1, ids.shape[1], tokenizer.vocab_size)


@pytest.mark.parametrize(
    "args,message",
    [
        (["train", "--preset", "huge"], "unknown preset 'huge'"),
        (["train", "--preset", "tiny", "--set", "train.nope=1"], "unknown key train.nope"),
        (["train", "--preset", "tiny", "--set", "train.precision.dtype=fp9"], "choose one of fp32"),
        (["speedrun", "--preset", "tiny", "--data", "/no/such/path"], "does not exist"),
        (["generate", "--checkpoint", "/no/such/run", "--prompt", "x"], "no checkpoint found"),
        (["eval", "--checkpoint", "/no/such/run"], "no checkpoint found"),
        (["tokenize", "--tokenizer", "/no/tok", "--input", "x", "--out", "y"], "/no/tok"),
    ],
)
def test_user_errors_are_one_line_without_traceback(args, message, capsys, tmp_path):
    code = main([*args, "--out", str(tmp_path / "o")] if args[0] in ("speedrun",) else args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_empty_and_undecodable_data_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("")
    (empty / "b.txt").write_bytes(b"\xff\xfe\x00bad")
    code = main(
        ["speedrun", "--preset", "tiny", "--data", str(empty), "--out", str(tmp_path / "r")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "error: no readable text found" in err
    assert "not UTF-8" in err


def test_changed_config_does_not_touch_an_existing_run(speedrun_dir, corpus_dir):
    out, _ = speedrun_dir
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    result = _run(
        "speedrun",
        "--preset",
        "tiny",
        "--data",
        corpus_dir,
        "--out",
        out,
        "--set",
        "train.optimizer.lr=0.1",
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "another config" in result.stderr
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


# --- one-line errors for bad checkpoints and devices; runs, eval and report (issue 15) ---


def _one_line_error(code, capsys):
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def _checkpoint_copy(speedrun_dir, dest):
    out, _ = speedrun_dir
    return Path(shutil.copytree(out / "checkpoints" / "step_60", dest))


def _truncate(ckpt):
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _other_shape(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["model"]["d_model"] = 32
    (ckpt / "config.json").write_text(json.dumps(config))


def _hf_folder(ckpt):
    from lmforge.model.hf import export_hf
    from lmforge.train.checkpoint import load_checkpoint

    model, tokenizer = load_checkpoint(ckpt)
    shutil.rmtree(ckpt)
    export_hf(model, tokenizer, ckpt)


BAD_CHECKPOINTS = {
    "truncated": (_truncate, "model.safetensors is damaged or truncated"),
    "other shape": (_other_shape, "does not match the model shape in"),
    "hugging face": (_hf_folder, "is a Hugging Face model folder: run `lmforge import --from"),
    "no tokenizer": (lambda c: shutil.rmtree(c / "tokenizer"), "tokenizer folder"),
    "missing": (shutil.rmtree, "no checkpoint found"),
}


@pytest.mark.parametrize("bad", list(BAD_CHECKPOINTS))
def test_bad_checkpoints_are_one_line_errors(bad, speedrun_dir, tmp_path, capsys):
    ckpt = _checkpoint_copy(speedrun_dir, tmp_path / "ckpt")
    damage, message = BAD_CHECKPOINTS[bad]
    damage(ckpt)
    err = _one_line_error(main(["generate", "--checkpoint", str(ckpt), "--prompt", "x"]), capsys)
    assert message in err


COMMANDS = {
    "generate": ["generate", "--prompt", "x"],
    "chat": ["chat"],
    "eval": ["eval"],
    "export": ["export", "--out", "{tmp}/hf"],
    "quantize": ["quantize", "--scheme", "int8", "--out", "{tmp}/hf"],
    "serve": ["serve", "--port", "0"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_loads_checkpoints_through_the_checked_loader(
    command, speedrun_dir, tmp_path, capsys
):
    if command == "serve":
        pytest.importorskip("fastapi")
    ckpt = _checkpoint_copy(speedrun_dir, tmp_path / "ckpt")
    _truncate(ckpt)
    args = [a.format(tmp=tmp_path) for a in COMMANDS[command]]
    err = _one_line_error(main([args[0], "--checkpoint", str(ckpt), *args[1:]]), capsys)
    assert "is damaged or truncated" in err and "export it again" in err
    assert not (tmp_path / "hf").exists()


def _torch_has(device):
    import torch

    if device == "cuda":
        return torch.cuda.is_available()
    return device == "mps" and torch.backends.mps.is_available()


@pytest.mark.parametrize(
    "command,device,message",
    [
        ("generate", "cuda", "CUDA is not available"),
        ("serve", "cuda", "CUDA is not available"),
        ("eval", "cuda:7", "CUDA"),
        ("chat", "tpu", "unknown device 'tpu': use cpu, cuda, cuda:N, mps or auto"),
        ("generate", "mps", "MPS) is not available"),
        ("train", "mps", "MPS) is not available"),
        ("train", "tpu", "unknown device 'tpu'"),
    ],
)
def test_unavailable_or_unknown_devices_are_one_line_errors(
    command, device, message, speedrun_dir, tmp_path, capsys
):
    if _torch_has(device.partition(":")[0]):
        pytest.skip(f"this machine has {device}")
    if command == "serve":
        pytest.importorskip("fastapi")
    out, _ = speedrun_dir
    if command == "train":
        args = ["train", "--preset", "tiny", "--out", str(tmp_path / "r"), "--device", device]
    else:
        args = [*COMMANDS[command], "--checkpoint", str(out), "--device", device]
    err = _one_line_error(main(args), capsys)
    assert message in err
    assert not (tmp_path / "r").exists()  # refused before the run folder was claimed


def test_out_of_range_settings_fail_before_any_work(tmp_path, capsys):
    out = tmp_path / "r"
    args = ["train", "--preset", "tiny", "--out", str(out), "--set", "train.optimizer.lr=-1"]
    err = _one_line_error(main(args), capsys)
    assert "train.optimizer.lr is -1.0: it must be above 0" in err
    assert not out.exists()


def test_a_run_on_missing_data_leaves_the_folder_free_for_the_corrected_one(tmp_path, capsys):
    out = tmp_path / "p1"
    args = ["speedrun", "--preset", "tiny", "--data", "/nonexistent", "--out", str(out)]
    err = _one_line_error(main(args), capsys)
    assert "data path /nonexistent does not exist" in err
    assert not (out / "config.toml").exists()


def test_eval_defaults_to_the_runs_own_validation_split_and_says_so(speedrun_dir, capsys):
    out, _ = speedrun_dir
    assert main(["eval", "--checkpoint", str(out)]) == 0
    default = capsys.readouterr().out.splitlines()
    assert default[0] == (
        f"evaluated token shards {(out / 'tokens').resolve()}: val shard, "
        f"{_val_tokens(out):,} tokens (the run's own validation data)"
    )
    assert main(["eval", "--checkpoint", str(out), "--data", str(out / "tokens")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == default[-1]  # the same numbers


def _val_tokens(run):
    from lmforge.tokens import load_tokens

    return len(load_tokens(run / "tokens", "val"))


def test_eval_on_a_checkpoint_whose_data_is_gone_asks_for_data(speedrun_dir, tmp_path, capsys):
    ckpt = _checkpoint_copy(speedrun_dir, tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    config["run"]["trained_on"] = {"shards": "/gone/tokens", "documents": "/gone/corpus"}
    (ckpt / "config.json").write_text(json.dumps(config))
    err = _one_line_error(main(["eval", "--checkpoint", str(ckpt)]), capsys)
    assert "was trained on is gone (/gone/tokens and /gone/corpus): pass --data" in err


def test_report_and_metrics_name_the_final_and_periodic_evaluations_apart(speedrun_dir):
    out, _ = speedrun_dir
    report = (out / "report.md").read_text()
    assert "| final evaluation: validation bits per byte |" in report
    assert "| periodic validation bits per byte, last (`val_bpb` in metrics.jsonl) |" in report
    assert "reads 4 batches (`train.eval.batches`)" in report
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    finals = [r for r in records if "final_val_bpb" in r]
    assert len(finals) == 1 and finals[0]["step"] == 60  # one, even after the rerun above
    assert finals[0]["final_eval_batches"] > 4
    periodic = [r for r in records if "val_bpb" in r]
    assert periodic and all(r["eval_batches"] == 4 for r in periodic)


def test_checkpoint_and_export_files_all_have_the_same_mode(speedrun_dir, tmp_path, capsys):
    out, _ = speedrun_dir
    hf = tmp_path / "hf"
    assert main(["export", "--checkpoint", str(out), "--out", str(hf)]) == 0
    for folder in (out / "checkpoints" / "step_60", hf):
        modes = {p.relative_to(folder): p.stat().st_mode & 0o777 for p in folder.rglob("*")}
        files = {name: mode for name, mode in modes.items() if (folder / name).is_file()}
        assert len(set(files.values())) == 1, files
