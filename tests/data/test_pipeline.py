"""Pipelines end to end: config, outputs, stats and summary, formats, workers, resuming, a full
disk."""

import json

import pytest

from lmforge.cli import main
from lmforge.data.documents import Document
from lmforge.data.pipeline import load_pipeline_config, read_output, registry, run_pipeline
from lmforge.data.pipeline.step import Filter
from lmforge.errors import LmforgeError
from tests.full_disk import fill_disk

ARTICLES = [
    "The committee met on Tuesday to discuss the new budget for the town library. Members agreed "
    "that the reading room needs better lighting and that the children's section should stay "
    "open later during the summer holidays.",
    "Heavy rain closed the mountain road for most of the week, and the farmers in the valley "
    "worried about their hay. By Friday the water had gone down and the first trucks were able "
    "to reach the market again.",
    "Our recipe for a simple loaf needs only flour, water, salt and a little yeast. Mix them the "
    "evening before, leave the dough in a cool place overnight, and bake it in a very hot oven "
    "the next morning.",
    "The museum has opened a small exhibition about the history of the railway. Old tickets, "
    "lamps and uniforms are shown next to photographs of the station as it looked a hundred "
    "years ago, when the line first opened.",
    "A new cycling path now connects the school with the river park. Parents say that more "
    "children ride to class since it opened, and the council plans to extend it to the harbour "
    "next spring if the money can be found.",
    "The chess club welcomes players of every level on Wednesday evenings. Beginners can learn "
    "the rules from volunteers, while stronger players prepare for the regional tournament that "
    "takes place at the end of the year.",
    "Scientists at the coastal station counted more seabirds this summer than in any year since "
    "records began. They think that cleaner water and a ban on fishing near the cliffs have "
    "given the colonies room to recover.",
]


def _article(i: int, who: str) -> str:
    return ARTICLES[i] + f" Write to {who}@example.org with any comments about this."


@pytest.fixture
def corpus(tmp_path):
    """Mixed inputs in three files: JSONL, an HTML page, plain text; duplicates and PII planted."""
    root = tmp_path / "in"
    root.mkdir()
    rows = [{"id": f"a{i}", "text": _article(i, f"person{i}")} for i in range(6)]
    rows.append({"id": "dup", "text": rows[0]["text"]})
    rows.append({"id": "fr", "text": "Le comité s'est réuni mardi pour discuter du budget. " * 8})
    rows.append({"id": "nsfw", "text": _article(2, "x")[:-40] + " Free porn videos here."})
    (root / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "b.html").write_text(f"<html><body><p>{_article(6, 'web')}</p></body></html>")
    trailing = [
        f"Line {i} of a list of the ships that were seen in the harbour..." for i in range(9)
    ]
    (root / "c.txt").write_text("\n".join(trailing) + "\n")
    return root


STEPS = "extract,langid,quality,toxicity,pii,exact_dedup,line_dedup,minhash_dedup"


def _cfg(corpus, out, *sets, **flags):
    base = {"input": [str(corpus)], "output": str(out), "steps": STEPS, "workers": 1}
    short_articles = "quality.gopher.min_words=30"
    return load_pipeline_config(None, {**base, **flags}, [short_articles, *sets])


def test_every_step_runs_and_the_stats_say_what_happened(corpus, tmp_path):
    stats = run_pipeline(_cfg(corpus, tmp_path / "out", "read.shard_bytes=1"))
    docs = list(read_output(tmp_path / "out"))
    ids = ["a0", "a1", "a2", "a3", "a4", "a5", f"{corpus.name}/b.html"]
    assert sorted(d.id for d in docs) == ids
    assert all("|||EMAIL_ADDRESS|||" in d.text and "@" not in d.text for d in docs)
    by_step = {s["name"]: s for s in stats["steps"]}
    assert list(by_step) == ["read", *STEPS.split(",")]
    assert by_step["langid"]["removed"] == {"langid_not_en": 1}
    assert by_step["quality"]["removed"] == {"gopher_ellipsis_lines": 1}
    assert by_step["toxicity"]["removed"] == {"toxicity_nsfw": 1}
    assert by_step["pii"]["counters"]["email"] == 8  # the copy is masked before dedup
    assert by_step["exact_dedup"]["removed"] == {"duplicate": 1}
    assert by_step["extract"]["counters"] == {"html_extracted": 1}
    assert stats["documents_in"] == 11 and stats["documents_out"] == 7 and stats["shards"] == 3
    assert json.loads((tmp_path / "out" / "stats.json").read_text()) == stats
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| langid | 11 | 10 | 1 |" in summary and "toxicity / toxicity_nsfw: 1" in summary
    assert not (tmp_path / "out" / ".work").exists()


def test_output_is_the_same_for_any_sharding_workers_and_format(corpus, tmp_path):
    one = run_pipeline(_cfg(corpus, tmp_path / "one", "write.format=jsonl"))
    many = run_pipeline(
        _cfg(corpus, tmp_path / "many", "read.shard_bytes=1", "write.format=parquet", workers=2)
    )
    a = [(d.id, d.text, d.meta) for d in read_output(tmp_path / "one")]
    b = [(d.id, d.text, d.meta) for d in read_output(tmp_path / "many")]
    assert a == b and len(a) == 7
    assert (one["shards"], many["shards"]) == (1, 3)
    assert sorted(p.suffix for p in (tmp_path / "many").glob("shard_*")) == [".parquet"] * 3


class CrashOnce(Filter):
    """Fails on a chosen document until a flag file exists; counts the documents it sees."""

    name = "crash_once"
    seen: list = []  # noqa: RUF012 - shared on purpose, the test reads it

    def filter(self, doc: Document) -> bool:
        CrashOnce.seen.append(doc.id)
        if doc.id == "boom" and not CrashOnce.flag.exists():
            raise RuntimeError("simulated crash")
        return True


def test_a_crashed_run_resumes_without_redoing_finished_shards(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.STEPS, "crash_once", CrashOnce)
    CrashOnce.flag = tmp_path / "fixed"
    CrashOnce.seen = []
    root = tmp_path / "in"
    root.mkdir()
    for name in ("a", "b", "c"):
        text = "boom" if name == "c" else name
        (root / f"{name}.jsonl").write_text(json.dumps({"id": text, "text": f"text {name}"}) + "\n")
    cfg = _cfg(root, tmp_path / "out", "read.shard_bytes=1", steps="crash_once,exact_dedup")
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_pipeline(cfg)
    assert CrashOnce.seen == ["a", "b", "boom"]
    done = sorted(p.name for p in (tmp_path / "out" / ".work" / "pass_0").glob("done_*"))
    assert done == ["done_00000", "done_00001"]
    CrashOnce.flag.touch()
    CrashOnce.seen = []
    stats = run_pipeline(cfg)
    assert CrashOnce.seen == ["boom"]  # shards 0 and 1 were not redone
    assert stats["steps"][1]["docs_in"] == 3  # their stats came back from disk
    assert sorted(d.id for d in read_output(tmp_path / "out")) == ["a", "b", "boom"]
    CrashOnce.seen = []
    assert run_pipeline(cfg) == stats and CrashOnce.seen == []  # a finished run is reused


def test_config_file_flags_and_overrides(tmp_path):
    toml = tmp_path / "p.toml"
    toml.write_text(
        'input = ["a"]\noutput = "o"\nsteps = ["langid", "quality"]\n'
        '[langid]\nlanguages = ["de"]\n[quality.gopher]\nmin_words = 10\n'
    )
    cfg = load_pipeline_config(
        str(toml), {"output": "elsewhere"}, ["quality.code.max_line_length=500"]
    )
    assert cfg.output == "elsewhere" and cfg.steps == ["langid", "quality"]
    assert cfg.step_config["langid"].languages == ["de"]
    assert cfg.step_config["quality"].gopher.min_words == 10
    assert cfg.step_config["quality"].code.max_line_length == 500
    for bad, message in (
        (["quality.gopher.min_wrds=1"], "unknown setting quality.gopher.min_wrds"),
        (["langid.min_confidence=high"], "langid.min_confidence must be float"),
        (["nosuchstep.x=1"], "unknown pipeline setting 'nosuchstep'"),
    ):
        with pytest.raises(LmforgeError, match=message):
            load_pipeline_config(str(toml), {}, bad)
    with pytest.raises(LmforgeError, match="unknown step"):
        load_pipeline_config(None, {"input": ["a"], "output": "o", "steps": "langid,nope"})


def test_output_folder_with_another_config_is_refused(corpus, tmp_path):
    run_pipeline(_cfg(corpus, tmp_path / "out", steps="exact_dedup"))
    with pytest.raises(LmforgeError, match="another config"):
        run_pipeline(_cfg(corpus, tmp_path / "out", steps="pii"))


def test_the_read_row_counts_every_file_read(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    (root / "good.txt").write_text("a readable line of text\n")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    out = tmp_path / "out"
    flags = {"input": [str(root)], "output": str(out)}
    stats = run_pipeline(load_pipeline_config(None, flags, ["write.format=jsonl"]))
    read = stats["steps"][0]
    assert (read["docs_in"], read["docs_out"], read["removed"]) == (2, 1, {"not_utf8": 1})
    assert stats["documents_in"] == 2
    assert "| read | 2 | 1 | 1 |" in (out / "summary.md").read_text()


def test_a_full_disk_during_a_shard_is_one_line_and_the_rerun_resumes(
    tmp_path, monkeypatch, capsys
):
    """The third output shard finds the disk full: `lmforge data run` exits 2 with one line
    naming the problem, the shard and the fix; the finished shards stay whole, nothing is left
    half written; with space back the same command finishes the run."""
    import lmforge.data.pipeline.writers as writers

    root = tmp_path / "in"
    root.mkdir()
    for name in ("a", "b", "c"):
        rows = [{"id": f"{name}{i}", "text": f"text {name} {i}"} for i in range(50)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    args = [
        "data", "run", "--input", str(root), "--output", str(out), "--steps", "exact_dedup",
        "--set", "read.shard_bytes=1", "--set", "write.format=jsonl", "--workers", "1",
    ]  # fmt: skip
    with monkeypatch.context() as m:
        fill_disk(
            m, writers, lambda path: path.name == "shard_00002.jsonl.tmp" and path.parent == out
        )
        assert main(args) == 2
    assert capsys.readouterr().err == (
        f"error: no space left on the device writing shard {out / 'shard_00002.jsonl'} (disk "
        "full): free space on that disk, then run the same command again: it keeps the shards "
        "finished so far and resumes after them\n"
    )
    assert sorted(p.name for p in out.glob("shard_*")) == ["shard_00000.jsonl", "shard_00001.jsonl"]
    assert [p for p in out.rglob("*") if ".tmp" in p.name] == []
    assert [d.id for d in read_output(out)] == [f"{n}{i}" for n in "ab" for i in range(50)]
    assert main(args) == 0
    assert [d.id for d in read_output(out)] == [f"{n}{i}" for n in "abc" for i in range(50)]


def test_what_a_killed_run_left_is_cleared_by_the_rerun(tmp_path):
    """A kill leaves what no `except` could remove: a temporary from claiming the folder (the
    rerun takes the folder, not "not empty"), temporaries of a resumed run, a half-removed
    .work of a finished one. The rerun clears each; a finished run's summary.md is there,
    written before stats.json marks the run finished."""
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.jsonl").write_text(json.dumps({"id": "a", "text": "text a"}) + "\n")
    out = tmp_path / "out"
    cfg = _cfg(root, out, steps="exact_dedup")
    out.mkdir()
    (out / ".pipeline.json.4242.tmp").write_text('{"inp')  # killed while claiming
    stats = run_pipeline(cfg)
    assert sorted(p.name for p in out.iterdir()) == [
        "pipeline.json", "shard_00000.jsonl.zst", "stats.json", "summary.md",
    ]  # fmt: skip
    (out / ".work" / "pass_0").mkdir(parents=True)  # killed while removing .work
    (out / "shard_00001.jsonl.zst.tmp").write_text("half")
    assert run_pipeline(cfg) == stats
    assert sorted(p.name for p in out.iterdir()) == [
        "pipeline.json", "shard_00000.jsonl.zst", "stats.json", "summary.md",
    ]  # fmt: skip
