import numpy as np

from lmforge.tokenizer import Tokenizer
from lmforge.tokens import load_doc_starts, load_tokens, read_meta


def test_prepared_shards_hold_each_document_after_a_separator(prepared):
    tokenizer = Tokenizer.load(prepared.shard_dir / "tokenizer")
    meta = read_meta(prepared.shard_dir)
    assert meta.tokenizer_fingerprint == tokenizer.fingerprint()
    assert meta.vocab_size == tokenizer.vocab_size == 320
    train = load_tokens(prepared.shard_dir, "train")
    starts = load_doc_starts(prepared.shard_dir, "train")
    assert len(train) == meta.shards["train"]["tokens"]
    assert len(starts) == meta.shards["train"]["documents"] == prepared.stats["documents"]["train"]
    assert (np.asarray(train)[starts] == tokenizer.eot_id).all()
    assert int((np.asarray(train) == tokenizer.eot_id).sum()) == len(starts)


def test_shards_decode_back_to_the_documents(prepared):
    from lmforge.data import read_jsonl

    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    val = np.asarray(load_tokens(prepared.shard_dir, "val"))
    starts = [*list(load_doc_starts(prepared.shard_dir, "val")), len(val)]
    docs = list(read_jsonl(prepared.root / "data" / "val.jsonl"))
    assert len(docs) == len(starts) - 1 >= 1
    for doc, a, b in zip(docs, starts, starts[1:], strict=False):
        assert tokenizer.decode(val[a + 1 : b].tolist()) == doc.text


def test_parallel_encoding_matches_single_process(prepared):
    from lmforge.tokens.encode import encode_texts

    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    texts = [f"def f{i}(x):\n    return x * {i}  # é ✓\n" for i in range(50)]
    assert list(encode_texts(tokenizer, texts, workers=2)) == list(
        encode_texts(tokenizer, texts, workers=1)
    )


def test_tokenize_refuses_input_without_text_and_fills_an_empty_val_split(prepared, tmp_path):
    import json

    from lmforge.cli import main
    from lmforge.data import is_validation

    args = ["tokenize", "--tokenizer", str(prepared.tokenizer_dir), "--workers", "1"]
    (tmp_path / "empty.txt").write_text("")
    out = tmp_path / "shards"
    assert main([*args, "--input", str(tmp_path / "empty.txt"), "--out", str(out)]) == 2
    assert not out.exists()  # nothing written
    ids = ["a", "b", "c"]
    assert not any(is_validation(i, 0.01) for i in ids)  # the hash holds none out
    rows = "".join(
        json.dumps({"id": i, "text": f"def {i}(x):\n    return x\n"}) + "\n" for i in ids
    )
    (tmp_path / "docs.jsonl").write_text(rows)
    assert main([*args, "--input", str(tmp_path / "docs.jsonl"), "--out", str(out)]) == 0
    shards = read_meta(out).shards
    assert (shards["train"]["documents"], shards["val"]["documents"]) == (2, 1)
    assert shards["val"]["tokens"] > 1


def test_a_split_without_documents_is_an_error_and_leaves_no_shard(prepared, tmp_path):
    import pytest

    from lmforge.errors import LmforgeError
    from lmforge.tokens.encode import tokenize_splits

    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    with pytest.raises(LmforgeError, match="the val split"):
        tokenize_splits(tokenizer, {"train": iter(["x = 1\n"]), "val": iter([])}, tmp_path, 1)
    assert not list(tmp_path.glob("val.*")) and not (tmp_path / "meta.json").exists()


def test_tokenize_writes_a_train_shard_alone_for_one_document_or_no_val_fraction(
    prepared, tmp_path, capsys
):
    import json

    from lmforge.cli import main

    args = ["tokenize", "--tokenizer", str(prepared.tokenizer_dir), "--workers", "1"]
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"id": "only", "text": "def f(x):\n    return x\n"}) + "\n")
    assert main([*args, "--input", str(one), "--out", str(tmp_path / "one")]) == 0
    assert sorted(read_meta(tmp_path / "one").shards) == ["train"]
    assert read_meta(tmp_path / "one").shards["train"]["documents"] == 1
    assert not (tmp_path / "one" / "val.bin").exists()

    rows = "".join(json.dumps({"id": i, "text": f"x = {i}\n"}) + "\n" for i in "abcdefgh")
    (tmp_path / "docs.jsonl").write_text(rows)
    out = tmp_path / "zero"
    cmd = [*args, "--input", str(tmp_path / "docs.jsonl"), "--out", str(out)]
    assert main([*cmd, "--val-fraction", "0"]) == 0
    assert sorted(read_meta(out).shards) == ["train"]
    assert read_meta(out).shards["train"]["documents"] == 8
    assert "no val shard" in capsys.readouterr().out


def test_training_on_shards_without_a_val_shard_is_a_one_line_error(prepared, tmp_path, capsys):
    import json

    from lmforge.cli import main

    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"id": "only", "text": "def f(x):\n    return x\n" * 50}) + "\n")
    shards = tmp_path / "shards"
    tokenize = ["tokenize", "--tokenizer", str(prepared.tokenizer_dir), "--workers", "1"]
    assert main([*tokenize, "--input", str(one), "--out", str(shards)]) == 0
    capsys.readouterr()
    train = ["train", "--preset", "tiny", "--data", str(shards), "--max-steps", "1"]
    assert main([*train, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no val shard" in err and "--val-fraction" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_a_full_disk_during_a_token_shard_is_one_line_and_leaves_no_stale_meta(
    prepared, tmp_path, monkeypatch, capsys
):
    """Tokenizing again into a finished folder, the val shard finds the disk full: one line
    naming the problem, the shard and the fix, exit 2; no temporary left, and no meta.json (the
    old one would describe shards that are no longer there). With space back the same command
    writes the folder as it was, byte for byte."""
    import lmforge.tokens.shards as shards_module
    from lmforge.cli import main
    from tests.full_disk import fill_disk

    out = tmp_path / "shards"
    args = [
        "tokenize", "--tokenizer", str(prepared.tokenizer_dir), "--workers", "1", "--input",
        str(prepared.root / "data"), "--out", str(out), "--val-fraction", "0.2",
    ]  # fmt: skip
    assert main(args) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    with monkeypatch.context() as m:
        fill_disk(m, shards_module, lambda path: path.name == "val.bin.tmp", room=1000)
        assert main(args) == 2
    assert capsys.readouterr().err == (
        f"error: no space left on the device writing token shard {out / 'val.bin'} (disk full): "
        "free space on that disk, then run the same command again\n"
    )
    names = ["tokenizer", "train.bin", "train.idx", "val.bin", "val.idx"]  # val: the old one
    assert sorted(p.name for p in out.iterdir()) == names
    assert (out / "val.bin").read_bytes() == before["val.bin"]
    assert main(args) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
