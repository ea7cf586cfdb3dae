"""Toxicity: the C4-style word list (whole words, any case, phrases) and its limits."""

import pytest

from lmforge.data.documents import Document
from lmforge.data.pipeline.steps import Toxicity
from lmforge.data.toxicity import DEFAULT_LIST, WordList
from lmforge.errors import LmforgeError


def test_word_list_matches_whole_words_and_phrases_in_any_case():
    words = WordList(["porn", "nude photos"])
    assert words.hits("Free PORN here") == ["porn"]
    assert words.hits("leaked Nude\n  Photos!") == ["nude photos"]
    assert words.hits("pornographic and unporned words, or nude photography") == []


def test_shipped_list_is_short_and_loaded_by_default():
    words = WordList.load(DEFAULT_LIST)
    assert 10 <= len(words.words) <= 60
    assert words.hits("a hardcore porn site") == ["hardcore porn"]


def test_toxicity_step_removes_c4_style_and_respects_max_hits(tmp_path):
    docs = [
        Document("clean", "A recipe for bread: flour, water, salt and time."),
        Document("nsfw", "Watch porn videos here."),
    ]
    step = Toxicity()
    assert [d.id for d in step(docs)] == ["clean"]
    assert step.stats.removed == {"toxicity_word_list": 1}
    lenient = Toxicity(Toxicity.Config(max_word_hits=1))
    assert [d.id for d in lenient(docs)] == ["clean", "nsfw"]
    custom = tmp_path / "words.txt"
    custom.write_text("# mine\nbread\n")
    assert [d.id for d in Toxicity(Toxicity.Config(word_list=str(custom)))(docs)] == ["nsfw"]


def test_missing_classifier_model_is_a_user_error(tmp_path):
    step = Toxicity(Toxicity.Config(classifier=str(tmp_path / "none.bin")))
    with pytest.raises(LmforgeError, match="does not exist"):
        list(step([Document("a", "text")]))
