"""Tokenizer folders: save/load round trip, GPT-2 published format, byte mapping, bad folders."""

import base64
import json
import shutil

import pytest
import tiktoken.load

from lmforge.errors import LmforgeError
from lmforge.tokenizer import GPT2_PATTERN, GPT4_PATTERN, Tokenizer, train_bpe
from lmforge.tokenizer.bytes_unicode import BYTE_TO_UNICODE, bytes_to_text, text_to_bytes

EOT = "<|endoftext|>"
TEXT = "def f(x):\n    return x  # 😀 日本語 <|endoftext|> done"


def test_byte_mapping_is_printable_bijection():
    chars = [BYTE_TO_UNICODE[b] for b in range(256)]
    assert len(set(chars)) == 256
    assert all(len(c) == 1 and c.isprintable() and not c.isspace() for c in chars)
    assert BYTE_TO_UNICODE[ord("A")] == "A"
    assert BYTE_TO_UNICODE[ord(" ")] == "Ġ"  # GPT-2's well-known space marker
    every = bytes(range(256))
    assert text_to_bytes(bytes_to_text(every)) == every


def test_save_load_round_trip(tmp_path, trained):
    trained.save(tmp_path / "tok")
    loaded = Tokenizer.load(tmp_path / "tok")
    assert loaded.fingerprint() == trained.fingerprint()
    assert loaded.encode(TEXT, allowed_special="all") == trained.encode(TEXT, allowed_special="all")
    assert loaded.merges == trained.merges
    assert loaded.special_tokens == trained.special_tokens
    lines = (tmp_path / "tok" / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "#version: 0.2"
    assert len(lines) == 1 + len(trained.merges)


def test_save_keeps_pattern_and_replaces_existing(tmp_path, corpus):
    target = tmp_path / "tok"
    first = train_bpe(corpus, 300)
    first.save(target)
    (target / "stray.txt").write_text("old")
    second = train_bpe(corpus, 350, pattern=GPT4_PATTERN)
    second.save(target)
    loaded = Tokenizer.load(target)
    assert loaded.pattern == GPT4_PATTERN
    assert loaded.fingerprint() == second.fingerprint()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]  # no temp folders left
    assert not (target / "stray.txt").exists()


def write_gpt2_folder(folder):
    """A tiny folder in GPT-2's published format: shuffled single-byte ids, then merges."""
    singles = [bytes([b]) for b in range(256)][::-1]  # ids deliberately not byte values
    merged = [(b" ", b"t"), (b"h", b"e"), (b" t", b"he")]
    vocab = {bytes_to_text(t): i for i, t in enumerate(singles)}
    for i, (a, b) in enumerate(merged):
        vocab[bytes_to_text(a + b)] = 256 + i
    vocab[EOT] = 256 + len(merged)
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    merges = [f"{bytes_to_text(a)} {bytes_to_text(b)}" for a, b in merged]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", "utf-8")
    return vocab


def test_load_gpt2_published_format(tmp_path):
    vocab = write_gpt2_folder(tmp_path / "gpt2")
    tok = Tokenizer.load(tmp_path / "gpt2")
    assert tok.pattern == GPT2_PATTERN
    assert tok.eot_id == vocab[EOT]
    assert tok.special_tokens == {EOT: vocab[EOT]}
    assert tok.merges == [(b" ", b"t"), (b"h", b"e"), (b" t", b"he")]
    ids = tok.encode(" the x", allowed_special="all")
    assert ids == [vocab["Ġthe"], vocab["Ġ"], vocab["x"]]
    assert tok.decode(ids) == " the x"
    assert tok.encode(EOT, allowed_special="all") == [vocab[EOT]]


def test_load_without_merges_derives_them(tmp_path):
    write_gpt2_folder(tmp_path / "gpt2")
    (tmp_path / "gpt2" / "merges.txt").unlink()
    tok = Tokenizer.load(tmp_path / "gpt2")
    assert tok.merges == [(b" ", b"t"), (b"h", b"e"), (b" t", b"he")]


def test_bad_folders_raise(tmp_path, trained):
    with pytest.raises(LmforgeError, match="not found"):
        Tokenizer.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LmforgeError, match=r"vocab\.json"):
        Tokenizer.load(tmp_path / "empty")
    trained.save(tmp_path / "tok")
    (tmp_path / "tok" / "lmforge_tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(LmforgeError, match=r"lmforge_tokenizer\.json"):
        Tokenizer.load(tmp_path / "tok")
    (tmp_path / "tok" / "lmforge_tokenizer.json").unlink()
    (tmp_path / "tok" / "vocab.json").write_text('{"a b": 0}', encoding="utf-8")
    with pytest.raises(LmforgeError, match=r"vocab\.json"):
        Tokenizer.load(tmp_path / "tok")
    (tmp_path / "tok" / "vocab.json").write_text("[1, 2", encoding="utf-8")
    with pytest.raises(LmforgeError, match=r"vocab\.json.*not valid JSON"):
        Tokenizer.load(tmp_path / "tok")
    (tmp_path / "file").write_text("x")
    with pytest.raises(LmforgeError, match="is a file"):
        trained.save(tmp_path / "file")
    with pytest.raises(LmforgeError, match="is a file.*load_tiktoken"):
        Tokenizer.load(tmp_path / "file")


def test_saved_folder_holds_every_format(tmp_path, trained):
    trained.save(tmp_path / "tok")
    names = sorted(p.name for p in (tmp_path / "tok").iterdir())
    assert names == [
        "lmforge_tokenizer.json",
        "merges.txt",
        "tokenizer.json",
        "tokenizer.tiktoken",
        "vocab.json",
    ]
    # Any one format (with the metadata for tiktoken's) loads the same tokenizer.
    for keep in (["tokenizer.json"], ["tokenizer.tiktoken", "lmforge_tokenizer.json"]):
        (tmp_path / "one").mkdir()
        for name in keep:
            (tmp_path / "one" / name).write_bytes((tmp_path / "tok" / name).read_bytes())
        assert Tokenizer.load(tmp_path / "one").fingerprint() == trained.fingerprint()
        shutil.rmtree(tmp_path / "one")


def test_tiktoken_format_round_trip(tmp_path, trained, gpt2_ranks):
    trained.save_tiktoken(tmp_path / "t.tiktoken")
    loaded = Tokenizer.load_tiktoken(tmp_path / "t.tiktoken", trained.special_tokens)
    assert loaded.fingerprint() == trained.fingerprint()
    # tiktoken's own reader agrees with our writer, and ours with GPT-2's file.
    assert tiktoken.load.load_tiktoken_bpe(str(tmp_path / "t.tiktoken")) == trained.mergeable_ranks
    assert len(gpt2_ranks) == 50256 and gpt2_ranks[b"!"] == 0 and gpt2_ranks[b" the"] == 262


def test_bad_tiktoken_file_names_the_line(tmp_path):
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    (tmp_path / "ok.tiktoken").write_text("\n".join(lines), encoding="ascii")
    assert Tokenizer.load_tiktoken(tmp_path / "ok.tiktoken").vocab_size == 256
    lines[7] = "not-base64!! 7"
    (tmp_path / "bad.tiktoken").write_text("\n".join(lines), encoding="ascii")
    with pytest.raises(LmforgeError, match="line 8"):
        Tokenizer.load_tiktoken(tmp_path / "bad.tiktoken")


def corrupt(folder, name, edit):
    path = folder / name
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        # merges from another tokenizer: line 5 needs a token the vocabulary lacks
        ("merges.txt", lambda t: _replace_line(t, 4, "zq qz"), r"merges\.txt line 5 .*lacks"),
        ("merges.txt", lambda t: _replace_line(t, 3, "justoneword"), r"line 4 .*not a GPT-2 merge"),
        ("merges.txt", lambda t: _swap_lines(t, 2, 9), r"line 4 .*id order"),
        ("vocab.json", lambda t: t.replace(": 300,", ": 301,", 1), "to both"),
        ("vocab.json", lambda t: t[:-5], "not valid JSON"),
        ("lmforge_tokenizer.json", lambda t: '{"pattern": 3}', "lacks 'pattern'"),
    ],
)
def test_corrupt_or_mismatched_files_name_the_problem(tmp_path, trained, name, edit, message):
    trained.save(tmp_path / "tok")
    corrupt(tmp_path / "tok", name, edit)
    with pytest.raises(LmforgeError, match=message):
        Tokenizer.load(tmp_path / "tok")


def test_merges_of_another_vocab_are_refused(tmp_path, trained, corpus):
    other = train_bpe([t[::-1] for t in corpus] * 20, 600, [EOT, "<|pad|>"])
    trained.save(tmp_path / "a")
    other.save(tmp_path / "b")
    shutil.copy(tmp_path / "b" / "merges.txt", tmp_path / "a" / "merges.txt")
    with pytest.raises(LmforgeError, match=r"merges\.txt line \d+ .*different tokenizers"):
        Tokenizer.load(tmp_path / "a")


def _replace_line(text, index, line):
    lines = text.split("\n")
    lines[index] = line
    return "\n".join(lines)


def _swap_lines(text, i, j):
    lines = text.split("\n")
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)
