"""Toxicity: the word lists (whole words, stems, exceptions), deobfuscation, `is_nsfw` / `is_toxic`,
their precision and recall on the hand-labelled set, the step, and user model files never unpickled.
"""

import json
import pickle
from pathlib import Path

import pytest

from lmforge.data import toxicity
from lmforge.data.documents import Document
from lmforge.data.pipeline.steps import Toxicity
from lmforge.data.scorer import load_scorer
from lmforge.data.toxicity import (
    DEFAULT_LIST,
    TOXIC_LIST,
    WordList,
    deobfuscate,
    is_nsfw,
    is_toxic,
)
from lmforge.errors import LmforgeError

CASES = [
    json.loads(line)
    for line in (Path(__file__).parent / "toxicity_cases.jsonl").read_text().splitlines()
]


def test_word_list_matches_whole_words_phrases_stems_and_skips_exceptions():
    words = WordList(["porn", "nude photos", "slut*", "cum", "!cum laude"])
    assert words.hits("Free PORN here") == ["porn"]
    assert words.hits("leaked Nude\n  Photos!") == ["nude photos"]
    assert words.hits("pornographic and unporned words, or nude photography") == []
    assert words.hits("sluts and slutty") == ["sluts", "slutty"]
    assert words.hits("graduated magna cum laude") == []
    assert words.hits("cum on") == ["cum"]


def test_shipped_lists_load_by_default_and_are_separate():
    nsfw, toxic = WordList.load(DEFAULT_LIST), WordList.load(TOXIC_LIST)
    assert 40 <= len(nsfw.words) <= 200 and 60 <= len(toxic.words) <= 300
    assert nsfw.hits("a hardcore porn site") == ["porn"]
    assert is_nsfw("Watch porn videos here.")[0] == "nsfw"
    assert is_toxic("Watch porn videos here.")[0] == "clean"
    assert is_toxic("Shut the fuck up.")[0] == "toxic"
    assert is_nsfw("Shut the fuck up.")[0] == "clean"


@pytest.mark.parametrize(
    "text",
    [
        "f*ck",
        "sh1t",
        "c*nt",
        "f u c k",
        "$hit",
        "fuk",
        "FUUUCK",
        "a$$hole",
        "c-u-n-t",
        "f**k",
        "b1tch",
    ],
)
def test_named_obfuscated_spellings_are_caught(text):
    assert is_toxic(f"well, {text} this")[0] == "toxic", deobfuscate(text)


@pytest.mark.parametrize(
    "text",
    [
        "Scunthorpe United",
        "a cocktail analysis",
        "the assassin from Essex",
        "Dick Francis wrote thrillers",
        "graduated magna cum laude",
        "blue tits at the feeder",
        "char *buf = a * b;",
        "kill -9 $(cat /run/app.pid)",
        "assert x == 1; os.abort()",
    ],
)
def test_scunthorpe_style_words_and_code_are_clean(text):
    assert is_toxic(text) == ("clean", 0.0) and is_nsfw(text) == ("clean", 0.0)


def test_verdicts_are_label_and_score():
    assert is_toxic("A recipe for bread.") == ("clean", 0.0)
    assert is_toxic("fuck this shit") == ("toxic", 0.75)
    assert is_nsfw("porn") == ("nsfw", 0.5)
    assert is_toxic("fuck", max_hits=1) == ("clean", 0.5)
    assert is_toxic("bread", WordList(["bread"])) == ("toxic", 0.5)


def test_no_code_clinical_or_trap_line_of_the_labelled_set_is_flagged():
    """The policy: clinical and anatomical terms, code words and name collisions stay clean."""
    kept = [c for c in CASES if c["kind"] in ("code", "clinical", "trap", "prose")]
    assert len(kept) >= 150
    flagged = [c["text"] for c in kept if is_toxic(c["text"])[0] != "clean"]
    flagged += [c["text"] for c in kept if is_nsfw(c["text"])[0] != "clean"]
    assert flagged == []


def _precision_recall(check, label: str) -> tuple[float, float]:
    predicted = [check(c["text"])[0] != "clean" for c in CASES]
    truth = [bool(c[label]) for c in CASES]
    tp = sum(p and t for p, t in zip(predicted, truth, strict=True))
    return tp / max(sum(predicted), 1), tp / max(sum(truth), 1)


def test_labelled_set_precision_and_recall_stay_at_the_measured_level():
    """Measured (benchmarks/bench_toxicity.py): toxic P 1.000 R 0.785, nsfw P 0.882 R 0.732."""
    assert len(CASES) >= 300
    precision, recall = _precision_recall(is_toxic, "toxic")
    assert precision >= 0.97 and recall >= 0.76, (precision, recall)
    precision, recall = _precision_recall(is_nsfw, "nsfw")
    assert precision >= 0.85 and recall >= 0.70, (precision, recall)


def test_toxicity_step_gives_separate_verdicts_and_respects_max_hits(tmp_path):
    docs = [
        Document("clean", "A recipe for bread: flour, water, salt and time."),
        Document("nsfw", "Watch porn videos here."),
        Document("toxic", "What the f*ck is this bread."),
    ]
    step = Toxicity()
    kept = list(step(docs))
    assert [d.id for d in kept] == ["clean"]
    assert kept[0].meta["nsfw_score"] == 0.0 and kept[0].meta["toxic_score"] == 0.0
    assert step.stats.removed == {"toxicity_nsfw": 1, "toxicity_toxic": 1}
    lenient = Toxicity(Toxicity.Config(max_word_hits=1))
    assert [d.id for d in lenient(docs)] == ["clean", "nsfw", "toxic"]
    only_nsfw = Toxicity(Toxicity.Config(toxic=False))
    assert [d.id for d in only_nsfw(docs)] == ["clean", "toxic"]
    custom = tmp_path / "words.txt"
    custom.write_text("# mine\nbread\n")
    mine = Toxicity(Toxicity.Config(word_list=str(custom), toxic_word_list=str(custom)))
    assert [d.id for d in mine(docs)] == ["nsfw"]


def test_toxicity_step_calls_the_one_document_functions(monkeypatch):
    seen = []

    def fake_toxic(text, words=None, max_hits=0):
        seen.append(text)
        return ("toxic", 0.9) if "bread" in text else ("clean", 0.1)

    monkeypatch.setattr(toxicity, "is_toxic", fake_toxic)
    docs = [Document("a", "bread"), Document("b", "water")]
    step = Toxicity()
    kept = list(step(docs))
    assert seen == ["bread", "water"]
    assert [d.id for d in kept] == ["b"] and kept[0].meta["toxic_score"] == 0.1


def test_missing_classifier_model_is_a_user_error(tmp_path):
    step = Toxicity(Toxicity.Config(classifier=str(tmp_path / "none.bin")))
    with pytest.raises(LmforgeError, match="does not exist"):
        list(step([Document("a", "text")]))


class _Trap:
    """Unpickling this writes a marker file: proof that a loader ran pickle."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "unpickled"))


@pytest.mark.parametrize("name", ["model.pkl", "model.joblib", "model.safetensors", "model.pt"])
def test_user_model_files_are_never_unpickled(tmp_path, name):
    marker = tmp_path / "marker"
    path = tmp_path / name
    path.write_bytes(pickle.dumps(_Trap(str(marker))))
    with pytest.raises(LmforgeError):
        load_scorer(str(path), "__label__toxic")
    with pytest.raises(LmforgeError):
        list(Toxicity(Toxicity.Config(classifier=str(path)))([Document("a", "text")]))
    assert not marker.exists()
    pickle.loads(path.read_bytes())  # the trap is live: plain unpickling does write the marker
    assert marker.exists()
