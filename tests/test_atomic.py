import errno
import json
import os

import pytest

from lmforge.atomic import disk_full_is_an_error, is_disk_full, write_json, write_text
from lmforge.errors import LmforgeError


def test_write_text_writes_the_text_and_returns_the_path(tmp_path):
    path = write_text(str(tmp_path / "a.txt"), "héllo\n")
    assert path == tmp_path / "a.txt"
    assert path.read_text(encoding="utf-8") == "héllo\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_write_json_writes_indented_json_and_a_final_newline(tmp_path):
    path = write_json(tmp_path / "a.json", {"b": [1, 2]})
    assert path.read_text() == json.dumps({"b": [1, 2]}, indent=2) + "\n"
    write_json(path, {"b": 1}, indent=1)
    assert path.read_text() == '{\n "b": 1\n}\n'
    write_json(path, {"b": 1}, indent=None)
    assert path.read_text() == '{"b": 1}\n'


def test_parent_folders_are_created(tmp_path):
    path = write_json(tmp_path / "x" / "y" / "a.json", [1])
    assert json.loads(path.read_text()) == [1]


def test_a_failed_serialisation_leaves_the_old_file_and_no_temporary(tmp_path):
    path = write_json(tmp_path / "a.json", {"old": True})
    before = path.read_text()
    with pytest.raises(TypeError):
        write_json(path, object())
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_failed_write_removes_its_temporary(tmp_path, monkeypatch):
    path = write_text(tmp_path / "a.txt", "old")

    def refuse(src, dst):
        raise OSError("no rename")

    monkeypatch.setattr("lmforge.atomic.os.replace", refuse)
    with pytest.raises(OSError, match="no rename"):
        write_text(path, "new")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_a_second_write_replaces_the_first(tmp_path):
    path = tmp_path / "a.txt"
    write_text(path, "first, and longer\n")
    write_text(path, "second\n")
    assert path.read_text() == "second\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def _raised_while(cause: BaseException, error: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException:
            raise error  # noqa: B904 - chained implicitly, as torch's writer chains it
    except BaseException as e:
        return e


@pytest.mark.parametrize(
    ("error", "full"),
    [
        (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), True),
        (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), True),
        (OSError(errno.EACCES, os.strerror(errno.EACCES)), False),
        (
            RuntimeError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            ),
            True,
        ),
        (
            _raised_while(OSError(errno.ENOSPC, "x"), RuntimeError("unexpected pos 704 vs 598")),
            True,
        ),
        (RuntimeError("unexpected pos 704 vs 598"), False),
        (ValueError("bad value"), False),
    ],
)
def test_a_full_disk_is_recognised_as_each_writer_reports_it(error, full):
    assert is_disk_full(error) is full


def test_a_full_disk_in_the_block_is_one_line_and_other_errors_pass(tmp_path):
    full = disk_full_is_an_error("shard", tmp_path / "a.bin", "free space")
    with pytest.raises(LmforgeError) as info, full:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert str(info.value) == (
        f"no space left on the device writing shard {tmp_path / 'a.bin'} (disk full): free space"
    )
    assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(PermissionError), disk_full_is_an_error("shard", tmp_path, "free space"):
        raise PermissionError(errno.EACCES, "denied")
