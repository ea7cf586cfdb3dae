"""`lmforge tokenizer train`: trains from files, shows progress, and refuses bad arguments."""

import json

import pytest

from lmforge.cli import main
from lmforge.tokenizer import GPT4_PATTERN, Tokenizer

EOT = "<|endoftext|>"


@pytest.fixture()
def inputs(tmp_path, stdlib_texts):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text(stdlib_texts[0], encoding="utf-8")
    lines = [json.dumps({"text": t}) for t in stdlib_texts[1:3]]
    (folder / "b.jsonl").write_text("\n".join(lines), encoding="utf-8")
    return folder


def test_trains_with_workers_and_specials(inputs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LMFORGE_PROGRESS", "1")
    out = tmp_path / "tok"
    code = main(
        [
            "tokenizer", "train", "--input", str(inputs), "--vocab-size", "700",
            "--special-token", EOT, "<|pad|>", "--special-token", "<|sep|>",
            "--pattern", "gpt4", "--workers", "2", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    captured = capsys.readouterr()
    assert f"vocab 700 written to {out}" in captured.out
    assert "pre-tokenize" in captured.err and "B/s" in captured.err
    assert "merges" in captured.err and "merge/s" in captured.err
    tok = Tokenizer.load(out)
    assert tok.vocab_size == 700
    assert tok.pattern == GPT4_PATTERN
    assert list(tok.special_tokens) == [EOT, "<|pad|>", "<|sep|>"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--special-token", ""], "special token is empty"),
        (["--vocab-size", "200"], "vocab_size 200 is below"),
    ],
)
def test_user_errors_are_one_line(inputs, tmp_path, capsys, args, message):
    code = main(["tokenizer", "train", "--input", str(inputs), "--out", str(tmp_path / "t"), *args])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "t").exists()


def test_invalid_utf8_flag(tmp_path, capsys):
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 au lait, " * 40)
    args = ["tokenizer", "train", "--input", str(tmp_path / "bad.txt"), "--vocab-size", "270"]
    assert main([*args, "--out", str(tmp_path / "r")]) == 0
    assert "40 invalid UTF-8 byte sequence(s) replaced" in capsys.readouterr().err
    assert main([*args, "--invalid-utf8", "skip", "--out", str(tmp_path / "s")]) == 0
    assert "skipped" in capsys.readouterr().err
    replaced, skipped = Tokenizer.load(tmp_path / "r"), Tokenizer.load(tmp_path / "s")
    assert any("\ufffd".encode() in t for t in replaced.mergeable_ranks)
    assert not any("\ufffd".encode() in t for t in skipped.mergeable_ranks)


def test_no_text_is_an_error_and_a_short_vocabulary_a_warning(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    args = ["tokenizer", "train", "--vocab-size", "300", "--workers", "1"]
    out = tmp_path / "t"
    assert main([*args, "--input", str(tmp_path / "empty.txt"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no text to train the tokenizer on" in err and err.count("\n") == 1
    assert not out.exists()
    (tmp_path / "small.txt").write_text("abab abab")
    assert main([*args, "--input", str(tmp_path / "small.txt"), "--out", str(out)]) == 0
    vocab = Tokenizer.load(out).vocab_size
    assert vocab < 300
    assert f"vocabulary reached {vocab} of the requested 300 tokens" in capsys.readouterr().err
