"""`lmforge quantize` end to end: GPTQ calibrated on the checkpoint's own validation split, then
generate and eval from the result; bad options are one-line errors that write nothing."""

import pytest
import torch

from lmforge.cli import main
from lmforge.model import ModelConfig, Transformer
from lmforge.quant.checkpoint import read_quantization
from lmforge.tokenizer import Tokenizer
from lmforge.train.checkpoint import save_checkpoint
from lmforge.train.checkpoint_dir import data_record


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, d_model=64, n_layers=2, n_heads=4, max_seq_len=32
    )
    torch.manual_seed(0)
    model = Transformer(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = {"trained_on": data_record(prepared.shard_dir, None)}
    root = tmp_path_factory.mktemp("ckpt")
    return save_checkpoint(root, 1, model, optimizer, {}, {}, run, prepared.tokenizer_dir)


def test_gptq_from_the_validation_split_then_generate_and_eval(checkpoint, tmp_path, capsys):
    out = tmp_path / "gptq"
    args = ["--scheme", "int4", "--group-size", "32", "--method", "gptq"]
    args += ["--calibration-sequences", "8", "--out", str(out)]
    assert main(["quantize", "--checkpoint", str(checkpoint), *args]) == 0
    assert "int4-g32 (gptq)" in capsys.readouterr().out
    assert read_quantization(out)["method"] == "gptq"
    greedy = ["--temperature", "0", "--max-new-tokens", "4"]
    assert main(["generate", "--checkpoint", str(out), "--prompt", "def f(", *greedy]) == 0
    assert capsys.readouterr().out.startswith("def f(")
    assert main(["eval", "--checkpoint", str(out)]) == 0
    assert "bits/byte" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scheme", "int4", "--method", "gptq", "--calibration", "nowhere"], "nowhere"),
        (["--scheme", "int8", "--calibration-sequences", "0"], "at least 1"),
    ],
)
def test_bad_options_are_one_line_errors(checkpoint, tmp_path, capsys, args, message):
    out = tmp_path / "q"
    assert main(["quantize", "--checkpoint", str(checkpoint), *args, "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()
