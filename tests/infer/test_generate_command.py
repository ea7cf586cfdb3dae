"""`lmforge generate` end to end on a small checkpoint: one prompt, a file of prompts, beams."""

import json

import pytest
import torch

from lmforge.cli import main
from lmforge.model import ModelConfig, Transformer
from lmforge.tokenizer import Tokenizer
from lmforge.train.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, d_model=32, n_layers=2, n_heads=4, max_seq_len=64
    )
    torch.manual_seed(0)
    model = Transformer(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    root = tmp_path_factory.mktemp("ckpt")
    return save_checkpoint(root, 1, model, optimizer, {}, {}, {}, prepared.tokenizer_dir)


def generate(capsys, checkpoint, *args):
    assert main(["generate", "--checkpoint", str(checkpoint), *map(str, args)]) == 0
    return capsys.readouterr().out


def test_a_file_of_prompts_gives_one_json_line_each_in_order(checkpoint, tmp_path, capsys):
    prompts = ["def main(", "import os", "x = 1"]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n")
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    args = ["--max-new-tokens", 6, "--seed", 3, "--logprobs", "--batch-size", 2]
    text = generate(capsys, checkpoint, "--prompts-file", tmp_path / "p.txt", *args)
    records = [json.loads(line) for line in text.splitlines()]
    assert [r["prompt"] for r in records] == prompts
    assert all(len(r["logprobs"]) == r["tokens"] <= 6 for r in records)
    assert all(r["finish_reason"] in ("length", "stop") for r in records)
    assert all(lp <= 0 for r in records for lp in r["logprobs"])
    again = generate(capsys, checkpoint, "--prompts-file", tmp_path / "p.jsonl", *args)
    # JSON lines read the same, and seeds make the tokens reproducible. Log-probabilities agree
    # to float rounding only: which requests share a decode step varies with timing, and the
    # packed-weight kernels sum in an order that depends on the number of rows.
    rerun = [json.loads(line) for line in again.splitlines()]
    for got, want in zip(rerun, records, strict=True):
        assert got["logprobs"] == pytest.approx(want.pop("logprobs"), rel=1e-5)
        assert got | {"logprobs": None} == want | {"logprobs": None}


def test_one_prompt_streams_its_continuation(checkpoint, capsys):
    greedy = ["--temperature", 0, "--max-new-tokens", 8]
    out = generate(capsys, checkpoint, "--prompt", "def f(", *greedy)
    assert out.startswith("def f(") and out.endswith("\n")
    record = json.loads(generate(capsys, checkpoint, "--prompt", "def f(", "--logprobs", *greedy))
    assert out == "def f(" + record["completion"] + "\n"


def test_speculative_decoding_leaves_greedy_text_unchanged(checkpoint, capsys):
    args = ["--prompt", "def main(", "--max-new-tokens", 30, "--temperature", 0]
    plain = generate(capsys, checkpoint, *args)
    assert generate(capsys, checkpoint, *args, "--speculative", "ngram") == plain
    # The checkpoint drafting for itself: every draft is kept, the text is the same.
    assert generate(capsys, checkpoint, *args, "--speculative", checkpoint) == plain


def test_beams_are_printed_best_first(checkpoint, capsys):
    out = generate(capsys, checkpoint, "--prompt", "x", "--beams", 3, "--max-new-tokens", 4)
    beams = json.loads(out)["beams"]
    assert len(beams) == 3
    assert [b["score"] for b in beams] == sorted((b["score"] for b in beams), reverse=True)


def test_a_bad_prompts_file_is_a_clear_error(checkpoint, tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"text": "no prompt field"}\n')
    assert (
        main(
            [
                "generate",
                "--checkpoint",
                str(checkpoint),
                "--prompts-file",
                str(tmp_path / "bad.jsonl"),
            ]
        )
        == 2
    )
    assert "'prompt' field" in capsys.readouterr().err


@pytest.fixture
def recorded(monkeypatch):
    """What `lmforge generate` hands run_generate (which loads no model here)."""
    import lmforge.infer.generate_command as run

    seen = {}

    def record(checkpoint, prompts, params, **options):
        seen.update(options, params=params)

    monkeypatch.setattr(run, "run_generate", record)
    return seen


def flags(*args):
    return main(["generate", "--checkpoint", "unused", "--prompt", "x", *map(str, args)])


def test_stop_strings_take_backslash_escapes(recorded):
    assert flags("--stop", r"\n", "--stop", r"a\tb\\n\u00e9", "--stop", "é\n") == 0
    assert recorded["params"].stop == ("\n", "a\tb\\né", "é\n")


def test_an_unknown_escape_in_a_stop_string_is_refused(recorded, capsys):
    assert flags("--stop", r"\q") == 2
    assert r"unknown escape \q" in capsys.readouterr().err


def test_sampling_defaults_are_filled_in_when_not_given(recorded):
    assert flags() == 0
    params = recorded["params"]
    assert (params.temperature, params.top_p, params.repetition_penalty) == (0.8, 0.95, 1.0)
    assert recorded["beams"] == 0 and recorded["length_penalty"] == 1.0
    assert flags("--beams", 3, "--length-penalty", 0.5, "--max-new-tokens", 5) == 0
    assert (recorded["beams"], recorded["length_penalty"]) == (3, 0.5)
    assert recorded["stream"] is False


@pytest.mark.parametrize(
    "args,message",
    [
        (["--beams", 3, "--temperature", 0.5], "--beams searches deterministically: --temperature"),
        (["--beams", 2, "--top-p", 0.9, "--seed", 1], "--top-p, --seed"),
        (["--beams", 2, "--logprobs"], "--logprobs"),
        (["--beams", 2, "--stop", "x"], "--stop"),
        (["--beams", 2, "--repetition-penalty", 1.0], "--repetition-penalty"),
        (["--beams", 0], "--beams 0 is not a beam search: pass 2 or more"),
        (["--beams", 1], "--beams 1 is not a beam search"),
        (["--length-penalty", 2], "--length-penalty scores beams"),
    ],
)
def test_contradictory_beam_flags_are_refused(recorded, capsys, args, message):
    assert flags(*args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert "params" not in recorded


def test_max_new_tokens_beyond_the_context_is_capped_with_a_note(checkpoint, capsys):
    args = ["--prompt", "def f(", "--max-new-tokens", "500", "--temperature", "0", "--logprobs"]
    assert main(["generate", "--checkpoint", str(checkpoint), *args]) == 0
    out, err = capsys.readouterr()
    record = json.loads(out)
    assert record["tokens"] <= 64 - 3 and record["finish_reason"] in ("length", "stop")
    assert "--max-new-tokens 500 does not fit the model's 64-token context" in err
    assert len(err.strip().splitlines()) == 1


def test_a_prompt_cut_to_fit_the_context_gets_a_note(checkpoint, capsys):
    args = ["--prompt", "word " * 80, "--max-new-tokens", "4", "--temperature", "0"]
    assert main(["generate", "--checkpoint", str(checkpoint), *args]) == 0
    err = capsys.readouterr().err
    assert "1 of 1 prompts do not fit the 64-token context" in err
    assert len(err.strip().splitlines()) == 1
