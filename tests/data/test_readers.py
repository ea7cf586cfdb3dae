"""Readers: every format, and bad input counted and skipped without losing a good document."""

import gzip
import io
import itertools
import json

import pytest
import zstandard

from lmforge.data.documents import read_documents
from lmforge.data.readers import ReadConfig, list_units, plan_shards, read_shard
from lmforge.data.stats import StepStats
from lmforge.errors import LmforgeError


def _read(*paths, **cfg):
    stats = StepStats("read")
    units = list_units([str(p) for p in paths])
    docs = list(read_shard(units, ReadConfig(**cfg), stats))
    return docs, stats


def _jsonl(n, start=0):
    return "".join(
        json.dumps({"id": f"d{i}", "text": f"document {i}"}) + "\n" for i in range(start, n)
    )


def _warc(records, gz):
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=gz)
    offsets = []
    for url, body, ctype in records:
        offsets.append(buf.tell())
        http = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
        rec = writer.create_warc_record(
            url, "response", payload=io.BytesIO(body), http_headers=http
        )
        writer.write_record(rec)
    return buf.getvalue(), offsets


def test_text_code_jsonl_html_and_ids(tmp_path):
    (tmp_path / "a.txt").write_text("line one\nline two\n")
    (tmp_path / "b.py").write_text("def f():\n    return 1\n")
    (tmp_path / "c.jsonl").write_text(
        _jsonl(3) + '{"text": "no id", "meta": {"k": 1}, "url": "u"}\n'
    )
    (tmp_path / "d.html").write_text("<html><body><p>Hello</p></body></html>")
    (tmp_path / "e.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    docs, stats = _read(tmp_path)
    by_id = {d.id: d for d in docs}
    folder = tmp_path.name  # ids name the folder given and the path within it
    assert by_id[f"{folder}/a.txt#0"].text == "line one\nline two\n"
    assert by_id[f"{folder}/b.py"].meta == {"format": "code", "lang": "py"}
    assert [by_id[f"d{i}"].text for i in range(3)] == ["document 0", "document 1", "document 2"]
    assert by_id[f"{folder}/c.jsonl:4"].meta == {"k": 1, "url": "u"}
    assert by_id[f"{folder}/d.html"].meta["format"] == "html"
    assert stats.removed == {"unsupported_file": 1}
    assert stats.docs_out == len(docs) == 7


def test_ids_do_not_depend_on_where_the_corpus_lives_or_how_it_is_named(tmp_path, monkeypatch):
    for place in ("a/corpus", "b/c/corpus"):
        (tmp_path / place / "sub").mkdir(parents=True)
        (tmp_path / place / "x.txt").write_text("alpha\n")
        (tmp_path / place / "sub" / "y.jsonl").write_text(_jsonl(1).replace('"id": "d0", ', ""))
    monkeypatch.chdir(tmp_path / "b")
    spellings = [tmp_path / "a" / "corpus", "c/corpus", "c/../c/corpus/"]
    ids = [sorted(d.id for d in _read(p)[0]) for p in spellings]
    assert ids[0] == ids[1] == ids[2] == ["corpus/sub/y.jsonl:1", "corpus/x.txt#0"]
    assert [d.id for d in read_documents(tmp_path / "a" / "corpus")] == [
        "corpus/sub/y.jsonl:1",
        "corpus/x.txt#0",
    ]  # lmforge.data.read_documents (tokenize, eval) names them the same way
    assert [d.id for d in _read(tmp_path / "a" / "corpus" / "x.txt")[0]] == ["x.txt#0"]


def test_compressed_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = _jsonl(50).encode()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    pq.write_table(
        pa.table({"id": ["p0", "p1"], "text": ["alpha", "beta"]}), tmp_path / "c.parquet"
    )
    docs, stats = _read(tmp_path)
    assert len(docs) == 102 and not stats.removed
    assert [d.text for d in docs[-2:]] == ["alpha", "beta"]


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_truncated_stream_keeps_every_complete_line(tmp_path, suffix):
    data = _jsonl(20000).encode()  # several zstd blocks: a cut block cannot be decoded
    packed = (
        gzip.compress(data) if suffix.endswith("gz") else zstandard.ZstdCompressor().compress(data)
    )
    (tmp_path / f"cut{suffix}").write_bytes(packed[: len(packed) // 2])
    (tmp_path / "good.jsonl").write_text(_jsonl(20005, start=20000))
    docs, stats = _read(tmp_path)
    ids = [d.id for d in docs]
    cut = [i for i in ids if int(i[1:]) < 20000]
    assert 0 < len(cut) < 20000
    assert cut == [f"d{i}" for i in range(len(cut))]  # a prefix, no half line
    assert ids[-5:] == [f"d{i}" for i in range(20000, 20005)]
    assert stats.removed == {"truncated_file": 1}


def test_bad_lines_empty_binary_large_and_not_utf8(tmp_path):
    lines = [
        '{"text": "good one"}',
        "{not json",
        '{"title": "no text field"}',
        '{"text": "   "}',
        '{"text": "' + "x" * 3000 + '"}',
        '{"text": "good two"}',
    ]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "b.txt").write_bytes(b"\x00\x01\x02binary\x00" * 100)
    (tmp_path / "c.txt").write_bytes("caf\xe9".encode("latin-1"))
    docs, stats = _read(tmp_path, max_doc_bytes=2000)
    assert [d.text for d in docs] == ["good one", "good two"]
    assert stats.removed == {
        "bad_json": 1,
        "no_text_field": 1,
        "empty": 1,
        "too_large": 1,
        "binary_file": 1,
        "not_utf8": 1,
    }
    assert stats.examples["bad_json"][0]["id"].endswith("a.jsonl:2")
    assert stats.docs_in == 8 == stats.docs_out + sum(stats.removed.values())  # all items read


def test_a_50mb_single_line_document_is_skipped_not_fatal(tmp_path):
    (tmp_path / "big.txt").write_text("y" * 50_000_000)
    (tmp_path / "small.txt").write_text("kept\n")
    docs, stats = _read(tmp_path, txt_chunk_bytes=0)
    assert [d.text for d in docs] == ["kept\n"]
    assert stats.removed == {"too_large": 1}


@pytest.mark.parametrize("gz", [False, True])
def test_corrupt_warc_record_is_skipped_and_later_records_kept(tmp_path, gz):
    pages = [
        (
            f"http://example.com/{i}",
            f"<html><body><p>page {i}</p></body></html>".encode(),
            "text/html",
        )
        for i in range(4)
    ]
    pages.insert(2, ("http://example.com/img", b"\x89PNG", "image/png"))
    data, offsets = _warc(pages, gz)
    broken = bytearray(data)
    at = offsets[1] + 12
    broken[at : at + 40] = b"\x00garbage!" * 4 + b"\x00" * 4
    name = "x.warc.gz" if gz else "x.warc"
    (tmp_path / name).write_bytes(bytes(broken))
    docs, stats = _read(tmp_path)
    assert [d.meta["url"] for d in docs] == [f"http://example.com/{i}" for i in (0, 2, 3)]
    assert all(d.meta["format"] == "html" and "<p>page" in d.text for d in docs)
    assert stats.removed == {"corrupt_warc_record": 1}
    assert stats.counters["warc_non_html_skipped"] == 1


def test_wet_conversion_records_are_text(tmp_path):
    from warcio.warcwriter import WARCWriter

    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    for i in range(2):
        rec = writer.create_warc_record(
            f"http://example.org/{i}", "conversion", payload=io.BytesIO(f"plain text {i}".encode())
        )
        writer.write_record(rec)
    (tmp_path / "a.warc.wet.gz").write_bytes(buf.getvalue())
    docs, _ = _read(tmp_path)
    assert [(d.text, d.meta["format"]) for d in docs] == [
        ("plain text 0", "text"),
        ("plain text 1", "text"),
    ]


def test_webdataset_tar_through_the_colleagues_reader(tmp_path):
    import tarfile

    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        for key, text in [("k0", "first sample"), ("k1", "second sample")]:
            data = text.encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    docs, _ = _read(tmp_path / "s.tar")
    assert [d.text for d in docs] == ["first sample", "second sample"]


def test_stdlib_ids_match_the_speedrun_reader():
    from lmforge.data.documents import stdlib_documents

    units = list_units(["stdlib"])[:30]
    docs = list(read_shard(units, ReadConfig(), StepStats("read")))
    expected = {d.id: d.text for d in itertools.islice(stdlib_documents(), 30)}
    assert docs and all(expected[d.id] == d.text for d in docs)


def test_sharding_groups_files_by_size_in_order(tmp_path):
    for i in range(6):
        (tmp_path / f"{i}.txt").write_text("z" * 100)
    shards = plan_shards(list_units([str(tmp_path)]), shard_bytes=250)
    assert [[u.path[-5:] for u in s] for s in shards] == [
        ["0.txt", "1.txt"],
        ["2.txt", "3.txt"],
        ["4.txt", "5.txt"],
    ]


def test_missing_path_and_missing_hf_datasets_are_user_errors(tmp_path, monkeypatch):
    with pytest.raises(LmforgeError, match="does not exist"):
        list_units([str(tmp_path / "nope")])
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(LmforgeError, match="pip install datasets"):
        list_units(["hf:some/dataset"])
