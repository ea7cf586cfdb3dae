"""Commands that need no model never import torch: `--help`, `--version`, plan, the tokenizer,
tokenize, the data pipeline, and the user errors found before a model is built (a bad config,
a checkpoint path that holds none)."""

import importlib
import subprocess
import sys
import types

import pytest

# Each command runs in one fresh interpreter, in order; after each, torch must still be absent.
SCRIPT = """
import sys
import types
from lmforge.cli import main

if __name__ == "__main__":
    for args in {commands!r}:
        try:
            code = main(args)
        except SystemExit as e:
            code = e.code
        print(code, "torch" in sys.modules, " ".join(args), file=sys.stderr, flush=True)
"""


CHECKPOINT_COMMANDS = [
    ("chat", ""),
    ("eval", ""),
    ("export", " --out x"),
]


def test_commands_that_need_no_model_do_not_import_torch(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text(
        "".join(f"line {i} of a small text about tokens and bytes\n" for i in range(200))
    )
    (tmp_path / "b.txt").write_text("another document, kept for the validation split\n" * 20)
    tok, shards = tmp_path / "tok", tmp_path / "shards"
    hf = tmp_path / "hf"  # a Hugging Face folder where a checkpoint belongs
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "llama"}')
    commands = [
        "--help",
        "--version",
        "train --help",
        "plan --model small",
        f"tokenizer train --input {text} --vocab-size 280 --out {tok}",
        f"tokenize --tokenizer {tok} --input {tmp_path} --out {shards} --val-fraction 0.5 "
        "--workers 1",
        f"data run --input {text} --output {tmp_path / 'd'} --steps quality",
        "train --set train.optimizer.lr=-1",
        "speedrun --set model.d_model=0",
        *(f"{c} --checkpoint {tmp_path / 'nothing'}{rest}" for c, rest in CHECKPOINT_COMMANDS),
        f"eval --checkpoint {hf}",
    ]
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(commands=[c.split() for c in commands]))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    lines = [x for x in result.stderr.splitlines() if x.split(" ")[0] in ("0", "2")]
    assert len(lines) == len(commands), result.stderr
    codes = []
    for line in lines:
        code, imported, command = line.split(" ", 2)
        assert imported == "False", f"`lmforge {command}` imported torch"
        codes.append(code)
    assert codes == ["0"] * 7 + ["2"] * (len(commands) - 7), result.stderr
    assert "lmforge import --from" in result.stderr


def test_version_names_the_package(capsys):
    from lmforge import __version__
    from lmforge.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"lmforge {__version__}"


@pytest.mark.parametrize("package", ["model", "train", "tokens", "infer", "eval", "report"])
def test_lazy_exports_are_not_shadowed_by_their_submodules(package):
    """A submodule import sets the package attribute of its name, so a lazy export named like
    its own module (a function `generate` beside infer/generate.py) would become the module."""
    module = importlib.import_module(f"lmforge.{package}")
    for name in module.__all__:
        getattr(module, name)  # the first access imports the submodule that defines it
        assert not isinstance(getattr(module, name), types.ModuleType), f"lmforge.{package}.{name}"
