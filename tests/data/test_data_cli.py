"""`lmforge data run` and `lmforge data train-classifier` from the command line."""

import json
from pathlib import Path

from lmforge.cli import main
from lmforge.data.pipeline import read_output

EXAMPLE = Path(__file__).parents[2] / "examples" / "pipeline.toml"

GOOD = [
    "A careful explanation of how tides follow the moon, with clear steps and examples.",
    "This guide explains how to plant tomatoes, water them and protect them from frost.",
    "The history of the printing press shows how books became cheap enough for everyone.",
    "Here we describe how a bicycle gear works and why lower gears make hills easier.",
]
SPAM = [
    "buy now cheap pills click here best price click here buy now",
    "win money fast click here casino bonus free spins buy now",
    "click here click here free free free offer limited buy now",
    "cheap loans no credit check click here apply now win big",
]


def _jsonl(path: Path, texts: list[str], prefix: str) -> None:
    rows = [{"id": f"{prefix}{i}", "text": t} for i, t in enumerate(texts)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_train_classifier_then_filter_with_it(tmp_path, capsys):
    _jsonl(tmp_path / "good.jsonl", GOOD * 5, "g")
    _jsonl(tmp_path / "spam.jsonl", SPAM * 5, "s")
    model = tmp_path / "quality.safetensors"
    args = ["--positive", str(tmp_path / "good.jsonl"), "--negative", str(tmp_path / "spam.jsonl")]
    assert main(["data", "train-classifier", *args, "--out", str(model)]) == 0
    assert (
        model.exists()
        and "classifier: trained on 20 positive / 20 negative" in capsys.readouterr().out
    )

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    _jsonl(mixed / "m.jsonl", [GOOD[0], SPAM[0], GOOD[2], SPAM[3]], "m")
    out = tmp_path / "out"
    run = ["data", "run", "--input", str(mixed), "--steps"]
    sets = ["--set", f"classifier.model={model}", "--set", "classifier.threshold=0.5"]
    code = main([*run, "classifier", "--output", str(out), *sets])
    assert code == 0
    kept = list(read_output(out))
    assert [d.id for d in kept] == ["m0", "m2"] and kept[0].meta["quality_score"] > 0.5
    stats = json.loads((out / "stats.json").read_text())
    assert stats["steps"][1]["removed"] == {"classifier_below_threshold": 2}

    toxic = tmp_path / "toxic"
    sets = ["--set", f"toxicity.classifier={model}", "--set", "toxicity.classifier_threshold=0.5"]
    code = main([*run, "toxicity", "--output", str(toxic), *sets])
    assert code == 0 and [d.id for d in read_output(toxic)] == ["m1", "m3"]


def test_documented_example_config_runs(tmp_path, capsys):
    web = tmp_path / "web"
    web.mkdir()
    body = " ".join(GOOD)
    (web / "page.html").write_text(f"<html><body><p>{body}</p></body></html>")
    (web / "notes.txt").write_text(body + "\nContact: jane@example.com\n")
    out = tmp_path / "out"
    code = main(
        [
            "data",
            "run",
            "--config",
            str(EXAMPLE),
            "--input",
            str(web),
            "--output",
            str(out),
            "--workers",
            "1",
        ]
    )
    assert code == 0
    docs = list(read_output(out))
    assert len(docs) == 1  # the page and the notes are near-duplicates: the first is kept
    assert docs[0].meta["lang"] == "en" and "tides" in docs[0].text
    assert "data: 2 documents in, 1 out" in capsys.readouterr().out


def test_user_errors_are_one_line(tmp_path, capsys):
    assert (
        main(["data", "run", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o")])
        == 2
    )
    assert "does not exist" in capsys.readouterr().err
    assert main(["data", "run", "--input", str(tmp_path), "--output", "o", "--steps", "bogus"]) == 2
    assert "unknown step(s) ['bogus']" in capsys.readouterr().err
