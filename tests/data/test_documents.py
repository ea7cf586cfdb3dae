import json

import pytest

from lmforge.data import ReadStats, read_documents, stdlib_documents
from lmforge.data.documents import TXT_CHUNK_BYTES, stdlib_root
from lmforge.errors import LmforgeError


def test_stdlib_corpus_is_one_document_per_py_file():
    stats = ReadStats()
    docs = [d for d, _ in zip(stdlib_documents(stats), range(50), strict=False)]
    assert len(docs) == 50
    first = docs[0]
    assert first.id.startswith("stdlib/") and first.id.endswith(".py")
    rel = first.id.removeprefix("stdlib/")
    assert first.text == (stdlib_root() / rel).read_text(encoding="utf-8")
    assert len({d.id for d in docs}) == 50


def test_small_txt_is_one_document_and_large_is_cut_at_lines(tmp_path):
    (tmp_path / "small.txt").write_text("hello\nworld\n")
    line = "x" * 99 + "\n"
    big = line * (3 * TXT_CHUNK_BYTES // len(line))
    (tmp_path / "big.txt").write_text(big)
    small = list(read_documents(tmp_path / "small.txt"))
    assert [d.text for d in small] == ["hello\nworld\n"]
    pieces = list(read_documents(tmp_path / "big.txt"))
    assert len(pieces) == 3
    assert "".join(d.text for d in pieces) == big
    assert all(d.text.endswith("\n") for d in pieces)
    assert len({d.id for d in pieces}) == 3


def test_jsonl_text_field_and_ids(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"id": "a", "text": "first"}, {"text": "second", "meta": {"k": 1}}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    docs = list(read_documents(path))
    assert [d.text for d in docs] == ["first", "second"]
    assert docs[0].id == "a" and docs[1].meta == {"k": 1}


def test_folder_mixes_txt_and_jsonl_and_ignores_other_files(tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text(json.dumps({"text": "beta"}) + "\n")
    (tmp_path / "c.bin").write_bytes(b"\x00\x01")
    assert sorted(d.text for d in read_documents(tmp_path)) == ["alpha", "beta"]


def test_non_utf8_file_is_skipped_counted_and_warned_once(tmp_path, capsys):
    (tmp_path / "good.txt").write_text("fine")
    (tmp_path / "bad1.txt").write_bytes(b"caf\xe9")
    (tmp_path / "bad2.txt").write_bytes(b"\xff\xfe\xfa")
    stats = ReadStats()
    docs = list(read_documents(tmp_path, stats))
    assert [d.text for d in docs] == ["fine"]
    assert stats.skipped_not_utf8 == 2 and stats.files == 3 and stats.documents == 1
    assert capsys.readouterr().err.count("not UTF-8") == 1


@pytest.mark.parametrize("make", ["missing", "empty_dir", "bad_jsonl"])
def test_bad_inputs_raise_one_line_errors(tmp_path, make):
    if make == "missing":
        path, expected = tmp_path / "nope.txt", "does not exist"
    elif make == "empty_dir":
        path, expected = tmp_path, "no .txt, .jsonl or .tar"
        (tmp_path / "x.csv").write_text("a,b")
    else:
        path, expected = tmp_path / "d.jsonl", "'text' field"
        path.write_text('{"text": "ok"}\n{"nope": 1}\n')
    with pytest.raises(LmforgeError, match=expected) as info:
        list(read_documents(path))
    assert "\n" not in str(info.value)
