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
    "export": {"--checkpoint", "--format", "--out"},
    "import": {"--from", "--out"},
    "speedrun": {
        "--preset",
        "--config",
        "--set",
        "--minutes",
        "--data",
        "--precision",
        "--activation-checkpointing",
        "--compile",
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
    },
    "tokenizer stats": {"--tokenizer", "--input"},
    "tokenize": {"--tokenizer", "--input", "--out", "--val-fraction", "--workers"},
    "train": {
        "--preset",
        "--config",
        "--set",
        "--data",
        "--max-steps",
        "--minutes",
        "--seed",
        "--device",
        "--parallel",
        "--precision",
        "--activation-checkpointing",
        "--compile",
        "--out",
        "--fresh",
    },
    "generate": {
        "--checkpoint",
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
        "--device",
    },
    "eval": {"--checkpoint", "--data", "--max-batches", "--device"},
    "serve": {
        "--checkpoint",
        "--host",
        "--port",
        "--max-batch-size",
        "--model-name",
        "--compile",
        "--device",
    },
    "chat": {
        "--checkpoint",
        "--max-tokens",
        "--temperature",
        "--top-p",
        "--seed",
        "--system",
        "--compile",
        "--device",
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


def _speedrun(corpus_dir, out):
    settings = ["--set", "train.max_steps=60", "--set", "data.val_fraction=0.1"]
    return _run("speedrun", "--preset", "tiny", "--data", corpus_dir, "--out", out, *settings)


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
    for stage in ("documents:", "tokenizer:", "tokens:", "evaluation:", "report:"):
        assert stage in stdout


def test_speedrun_rerun_reuses_every_stage(speedrun_dir, corpus_dir):
    out, _ = speedrun_dir
    result = _speedrun(corpus_dir, out)
    assert result.returncode == 0, result.stderr
    for stage in (
        "documents: reusing",
        "tokenizer: reusing",
        "tokens: reusing",
        "training: reusing",
    ):
        assert stage in result.stdout


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


def test_eval_on_documents_and_on_shards_agree(speedrun_dir, corpus_dir):
    out, _ = speedrun_dir
    on_docs = _run("eval", "--checkpoint", out, "--data", out / "data" / "val.jsonl")
    on_shards = _run("eval", "--checkpoint", out, "--data", out / "tokens")
    assert on_docs.returncode == 0, on_docs.stderr
    assert "bits/byte" in on_docs.stdout
    assert on_docs.stdout == on_shards.stdout  # the same held-out documents either way
    raw = _run("eval", "--checkpoint", out, "--data", corpus_dir)  # before cleaning: same split
    assert raw.returncode == 0 and "bits/byte" in raw.stdout


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
        (["train", "--preset", "tiny", "--set", "train.precision=fp9"], "choose one of fp32"),
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
        "speedrun", "--preset", "tiny", "--data", corpus_dir, "--out", out, "--set", "train.lr=0.1"
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "another config" in result.stderr
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
