"""Missing optional packages are one-line errors before any work; a failed run leaves no temp files.

A missing package is simulated with `sys.modules[name] = None`, which makes both
`importlib.util.find_spec` and `import` report it absent.
"""

import json
import sys
from pathlib import Path

import pytest

from lmforge.data.documents import Document
from lmforge.data.pipeline import load_pipeline_config, read_output, registry, run_pipeline
from lmforge.data.pipeline.step import Filter
from lmforge.errors import LmforgeError

EXAMPLE = Path(__file__).parents[2] / "examples" / "pipeline.toml"


def _absent(monkeypatch, *names):
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_the_documented_example_names_the_extra_before_writing_anything(monkeypatch, tmp_path):
    _absent(monkeypatch, "zstandard")
    out = tmp_path / "out"
    cfg = load_pipeline_config(str(EXAMPLE), {"output": str(out)})
    with pytest.raises(LmforgeError) as error:
        run_pipeline(cfg)
    message = _one_line(error)
    assert "writing jsonl.zst shards needs zstandard" in message
    assert message.endswith("pip install 'lmforge[data]'")
    assert not out.exists()  # the folder is not even claimed
    _absent(monkeypatch, "zstandard", "py3langid")
    with pytest.raises(LmforgeError) as error:
        run_pipeline(cfg)
    assert "the langid step and writing jsonl.zst shards need py3langid" in _one_line(error)


@pytest.mark.parametrize(
    ("files", "sets", "flags", "absent", "expected"),
    [
        ({"a.parquet": b"PAR1"}, [], {}, "pyarrow", "reading Parquet files needs pyarrow"),
        ({"a.jsonl.zst": b""}, [], {}, "zstandard", "reading .zst files needs zstandard"),
        ({"a.warc": b""}, [], {}, "warcio", "reading WARC files needs warcio"),
        ({"a.html": b"<p>x</p>"}, [], {}, "resiliparse", "reading HTML files needs resiliparse"),
        ({}, [], {"steps": "langid"}, "py3langid", "the langid step needs py3langid"),
        ({}, [], {"steps": "extract"}, "resiliparse", "the extract step needs resiliparse"),
        ({}, ["write.format=parquet"], {}, "pyarrow", "writing Parquet shards needs pyarrow"),
        ({}, [], {"executor": "ray"}, "ray", "--executor ray needs ray"),
    ],
)
def test_every_optional_package_is_checked_up_front(
    monkeypatch, tmp_path, files, sets, flags, absent, expected
):
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.txt").write_text("some text\n")
    for name, data in files.items():
        (root / name).write_bytes(data)
    _absent(monkeypatch, absent)
    base = {"input": [str(root)], "output": str(tmp_path / "out"), "workers": 1}
    cfg = load_pipeline_config(None, {**base, **flags}, ["write.format=jsonl", *sets])
    with pytest.raises(LmforgeError) as error:
        run_pipeline(cfg)
    message = _one_line(error)
    assert message.startswith(expected) and "pip install 'lmforge[" in message
    assert not (tmp_path / "out").exists()


def test_a_fasttext_model_without_fasttext_says_to_install_it(monkeypatch, tmp_path):
    (tmp_path / "a.txt").write_text("some text\n")
    _absent(monkeypatch, "fasttext")
    flags = {"input": [str(tmp_path / "a.txt")], "output": str(tmp_path / "out")}
    cfg = load_pipeline_config(None, {**flags, "steps": "classifier"}, ["classifier.model=q.bin"])
    with pytest.raises(LmforgeError, match=r"q\.bin needs fasttext.*: pip install fasttext$"):
        run_pipeline(cfg)


def test_lazy_imports_of_extras_are_one_line_errors(monkeypatch, tmp_path):
    from lmforge.data import langid
    from lmforge.data.html import html_to_text
    from lmforge.data.pipeline.writers import read_shard_file, write_shard

    _absent(monkeypatch, "zstandard", "resiliparse", "py3langid", "pyarrow")
    docs = [Document("a", "text")]
    with pytest.raises(LmforgeError, match=r"needs zstandard.*lmforge\[data\]"):
        write_shard(tmp_path / "s.jsonl.zst", docs, "jsonl.zst")
    with pytest.raises(LmforgeError, match=r"needs pyarrow.*lmforge\[parquet\]"):
        write_shard(tmp_path / "s.parquet", docs, "parquet")
    assert list(tmp_path.iterdir()) == []  # no shard, no temp file
    (tmp_path / "t.jsonl.zst").write_bytes(b"")
    with pytest.raises(LmforgeError, match=r"needs zstandard"):
        list(read_shard_file(tmp_path / "t.jsonl.zst"))
    with pytest.raises(LmforgeError, match=r"needs resiliparse.*lmforge\[data\]"):
        html_to_text("<p>hello</p>")
    langid._identifier.cache_clear()
    try:
        with pytest.raises(LmforgeError, match=r"needs py3langid.*lmforge\[data\]"):
            langid.identify("hello there")
    finally:
        langid._identifier.cache_clear()


class Interrupt(Filter):
    """Raises KeyboardInterrupt (Ctrl-C) at the document `stop`, after writing some shards."""

    name = "interrupt"
    armed = True

    def filter(self, doc: Document) -> bool:
        if Interrupt.armed and doc.id == "stop":
            raise KeyboardInterrupt
        return True


def test_an_interrupted_run_leaves_no_temp_files_and_resumes(monkeypatch, tmp_path):
    monkeypatch.setitem(registry.STEPS, "interrupt", Interrupt)
    root = tmp_path / "in"
    root.mkdir()
    for name in ("a", "b", "c"):
        rows = [{"id": f"{name}{i}", "text": f"text {name} {i}"} for i in range(300)]
        if name == "b":
            rows[280]["id"] = "stop"  # after the first 256-document batch reached the shard
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    flags = {"input": [str(root)], "output": str(out), "workers": 1, "steps": "interrupt"}
    cfg = load_pipeline_config(None, flags, ["read.shard_bytes=1", "write.format=jsonl"])
    Interrupt.armed = True
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(cfg)
    assert [p.name for p in out.rglob("*.tmp*")] == []
    assert (out / "shard_00000.jsonl").exists()  # the finished shard stays for the rerun
    Interrupt.armed = False
    stats = run_pipeline(cfg)
    assert stats["documents_out"] == 900 and len(list(read_output(out))) == 900
