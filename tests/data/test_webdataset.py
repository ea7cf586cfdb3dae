import io
import json
import tarfile

import pytest

from lmforge.data import ReadStats, read_documents
from lmforge.data.webdataset import split_key
from lmforge.errors import LmforgeError


def _tar(path, members, mode="w"):
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            body = data if isinstance(data, bytes) else data.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path


SAMPLES = [
    ("s1.txt", "first text"),
    ("s1.json", json.dumps({"meta": {"lang": "en"}})),
    ("s2.json", json.dumps({"id": "doc-2", "text": "second text", "meta": {"src": "web"}})),
    ("s3.jpg", b"\xff\xd8 not text"),  # an image-only sample: skipped
    ("sub/s4.txt", "fourth text"),
    ("s5.txt", b"\xff\xfe bad"),  # not UTF-8: skipped and counted
    ("s6.txt", "sixth text"),
]


def test_tar_members_group_by_key_into_documents(tmp_path):
    stats = ReadStats()
    docs = list(read_documents(_tar(tmp_path / "shard-000.tar", SAMPLES), stats))
    path = tmp_path / "shard-000.tar"
    assert [(d.id, d.text, d.meta) for d in docs] == [
        (f"{path}:s1", "first text", {"lang": "en"}),
        ("doc-2", "second text", {"src": "web"}),
        (f"{path}:sub/s4", "fourth text", {}),
        (f"{path}:s6", "sixth text", {}),
    ]
    assert (stats.files, stats.documents, stats.skipped_not_utf8) == (1, 4, 1)


def test_folder_mixes_tar_gz_and_text_files(tmp_path):
    _tar(tmp_path / "a.tar.gz", [("k.txt", "from tar")], mode="w:gz")
    (tmp_path / "b.txt").write_text("from txt\n")
    (tmp_path / "notes.md").write_text("ignored")
    assert [d.text for d in read_documents(tmp_path)] == ["from tar", "from txt\n"]


def test_keys_end_at_the_first_dot_of_the_file_name():
    assert split_key("a.b/c.seg.txt") == ("a.b/c", "seg.txt")
    assert split_key("x.json") == ("x", "json")


def test_broken_tar_and_json_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"this is not a tar archive" * 40)
    with pytest.raises(LmforgeError, match="not a readable tar"):
        list(read_documents(bad))
    broken = _tar(tmp_path / "json.tar", [("k.json", "{not json")])
    with pytest.raises(LmforgeError, match=r"k\.json is not a JSON object"):
        list(read_documents(broken))
