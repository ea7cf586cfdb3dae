"""`<|endoftext|>`-separated .txt files (TinyStories, OpenWebText dumps): one document per story,
and the separator reaches the shards as the end-of-text id, never as literal text."""

import itertools

import numpy as np
import pytest

from lmforge.cli import main
from lmforge.data.documents import read_documents, split_text
from lmforge.data.readers import ReadConfig, list_units, read_shard
from lmforge.data.stats import StepStats
from lmforge.tokenizer import Tokenizer
from lmforge.tokens import load_doc_starts, load_tokens

STORIES = [
    f"Once upon a time, a little {animal} named {name} lived by the sea.\n"
    f"Every day {name} looked at the waves and smiled.\n"
    for animal, name in [
        ("cat", "Tom"),
        ("dog", "Ben"),
        ("bird", "Sue"),
        ("fish", "Max"),
        ("frog", "Lily"),
        ("duck", "Sam"),
        ("bear", "Mia"),
        ("fox", "Leo"),
    ]
]


@pytest.fixture
def stories_txt(tmp_path):
    """A TinyStories-format file: stories separated by `<|endoftext|>` lines."""
    path = tmp_path / "stories.txt"
    path.write_text("".join(s + "<|endoftext|>\n" for s in STORIES[:-1]) + STORIES[-1])
    return path


def test_split_text_splits_at_separator_lines_only():
    text = "a\n  <|endoftext|>  \nb <|endoftext|> inline\n<|endoftext|>\n\n<|endoftext|>\nc\n"
    assert list(split_text(text)) == ["a\n", "b <|endoftext|> inline\n", "c\n"]
    assert list(split_text("x\n===\ny\n", "===")) == ["x\n", "y\n"]
    assert list(split_text(text, "")) == [text]  # "" disables the split


def test_split_text_without_separator_keeps_the_chunking():
    text = "".join(f"line {i}\n" for i in range(100))
    assert list(split_text(text, chunk_bytes=80)) == list(split_text(text, "", chunk_bytes=80))
    assert "".join(split_text(text, chunk_bytes=80)) == text


def test_tinystories_file_becomes_one_document_per_story(stories_txt):
    docs = list(read_documents(stories_txt))
    assert [d.id for d in docs] == [f"stories.txt#{i}" for i in range(len(STORIES))]
    assert [d.text for d in docs] == STORIES
    piped = list(read_shard(list_units([str(stories_txt)]), ReadConfig(), StepStats("read")))
    assert [(d.id, d.text) for d in piped] == [(d.id, d.text) for d in docs]
    whole = ReadConfig(doc_separator="")
    assert len(list(read_shard(list_units([str(stories_txt)]), whole, StepStats("read")))) == 1


def test_tokenize_writes_the_separator_as_the_end_of_text_id(stories_txt, tmp_path):
    tok_dir, shards = tmp_path / "tok", tmp_path / "shards"
    train = ["tokenizer", "train", "--input", str(stories_txt), "--vocab-size", "300"]
    assert main([*train, "--out", str(tok_dir), "--workers", "1"]) == 0
    tokenize = ["tokenize", "--tokenizer", str(tok_dir), "--input", str(stories_txt)]
    assert main([*tokenize, "--out", str(shards), "--val-fraction", "0.2", "--workers", "1"]) == 0
    tokenizer = Tokenizer.load(tok_dir)
    literal = tokenizer.encode_ordinary("<|endoftext|>")
    stories = []
    for split in ("train", "val"):
        ids = np.asarray(load_tokens(shards, split)).tolist()
        starts = [*load_doc_starts(shards, split).tolist(), len(ids)]
        assert all(ids[a] == tokenizer.eot_id for a in starts[:-1])  # each story after an eot
        assert ids.count(tokenizer.eot_id) == len(starts) - 1
        assert not any(ids[i : i + len(literal)] == literal for i in range(len(ids)))
        stories += [tokenizer.decode(ids[a + 1 : b]) for a, b in itertools.pairwise(starts)]
    assert sorted(stories) == sorted(STORIES)


def test_doc_separator_flag_overrides(tmp_path):
    path = tmp_path / "dump.txt"
    path.write_text("first doc\n---\nsecond doc\n<|endoftext|>\nstill second\n")
    docs = list(read_documents(path, separator="---"))
    assert [d.text for d in docs] == ["first doc\n", "second doc\n<|endoftext|>\nstill second\n"]


@pytest.mark.parametrize("command", ["train", "speedrun"])
def test_doc_separator_flag_sets_the_data_key(command):
    from lmforge.cli import build_parser
    from lmforge.run_flags import run_config

    parser = build_parser()
    assert run_config(parser.parse_args([command])).data.doc_separator == "<|endoftext|>"
    args = parser.parse_args([command, "--doc-separator", ""])
    assert run_config(args).data.doc_separator == ""
    args = parser.parse_args([command, "--set", "data.doc_separator=---"])
    assert run_config(args).data.doc_separator == "---"


def test_tokenizer_train_never_learns_a_custom_separator(tmp_path):
    from lmforge.prepare import TokenizerConfig, train_tokenizer
    from lmforge.tokenizer import train_bpe

    path = tmp_path / "dump.txt"
    path.write_text("".join(s + "~~~~\n" for s in STORIES))
    tok = TokenizerConfig(vocab_size=300, special_tokens=["<|endoftext|>"])
    trained = train_tokenizer([str(path)], tok, tmp_path / "tok", 1, doc_separator="~~~~")
    expected = train_bpe(STORIES, 300, ["<|endoftext|>"], workers=1)
    assert trained.fingerprint() == expected.fingerprint()
