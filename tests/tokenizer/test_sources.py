"""Training input chunks: nothing lost or reordered, bounded in size, JSONL lines kept whole."""

import json

from lmforge.tokenizer.sources import (
    MAX_CARRY,
    InputStats,
    file_chunks,
    jsonl_texts,
    text_chunks,
)

EOT = "<|endoftext|>"


def test_text_chunks_keep_texts_apart_and_whole(stdlib_texts):
    texts = ["short one", *stdlib_texts, "", "tail"]
    chunks = list(text_chunks(texts, [EOT], chunk_bytes=4_000))
    assert all(c.size < 2 * 4_000 for c in chunks)
    pieces = [p for c in chunks for p in c.texts]
    assert "".join(pieces) == "".join(texts)
    assert pieces[0] == "short one" and pieces[-1] == "tail"


def test_file_chunks_stream_a_text_file(tmp_path, stdlib_texts):
    text = EOT.join(stdlib_texts)
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    stats = InputStats()
    chunks = list(file_chunks([tmp_path / "a.txt"], [EOT], chunk_bytes=10_000, stats=stats))
    assert "".join(p for c in chunks for p in c.texts) == text
    assert len(chunks) > 20 and max(c.size for c in chunks) < 20_000
    assert stats.bytes == len(text.encode()) and stats.files == 1


def test_endless_word_is_cut_after_max_carry(tmp_path):
    (tmp_path / "a.txt").write_text("a" * 50_000, encoding="utf-8")
    chunks = list(file_chunks([tmp_path / "a.txt"], [], chunk_bytes=1_000))
    assert "".join(c.texts[0] for c in chunks) == "a" * 50_000
    assert max(c.size for c in chunks) <= (MAX_CARRY + 1) * 1_000


def test_jsonl_chunks_hold_whole_lines_and_number_them(tmp_path):
    docs = [{"id": i, "text": f"document {i} " + "é" * (i % 7)} for i in range(300)]
    (tmp_path / "d.jsonl").write_text("\n".join(map(json.dumps, docs)) + "\n", encoding="utf-8")
    chunks = list(file_chunks([tmp_path / "d.jsonl"], [EOT], chunk_bytes=500))
    assert [t for c in chunks for t in jsonl_texts(c)] == [d["text"] for d in docs]
    assert chunks[1].first_line == 1 + chunks[0].texts[0].count("\n")


def test_max_bytes_finishes_the_jsonl_line(tmp_path):
    docs = [{"text": "x" * 100} for _ in range(50)]
    (tmp_path / "d.jsonl").write_text("\n".join(map(json.dumps, docs)), encoding="utf-8")
    stats = InputStats()
    chunks = list(file_chunks([tmp_path / "d.jsonl"], [], 64, stats=stats, max_bytes=1_000))
    texts = [t for c in chunks for t in jsonl_texts(c)]
    assert len(texts) == 9  # lines of 113 bytes: the ninth holds byte 1,000
    assert stats.bytes == 9 * 113
