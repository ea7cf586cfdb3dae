"""The speedrun on a prose corpus: stories are judged by prose rules, survive cleaning, and train.

Before `data.quality_profile`, the speedrun applied the code rules to every corpus, and a JSONL
of one-paragraph stories lost every document to `code_mean_line_length`.
"""

import json
import random

import pytest

from lmforge.config import load_config
from lmforge.errors import LmforgeError

NAMES = ["Lily", "Tom", "Mia", "Ben", "Sara", "Max", "Anna", "Leo", "Zoe", "Sam", "Ella", "Finn"]
THINGS = [
    "ball", "kite", "box", "hat", "drum", "boat", "book", "cup", "shell", "stone", "bell",
    "map", "key", "lamp", "coat", "sock", "cake", "leaf", "feather", "ribbon", "basket", "rope",
]  # fmt: skip
PLACES = [
    "park", "garden", "forest", "beach", "kitchen", "school", "river", "hill", "farm", "market",
    "library", "field", "pond", "street", "yard", "cave", "bridge", "meadow", "harbor", "barn",
]  # fmt: skip
ADJECTIVES = [
    "red", "big", "shiny", "small", "soft", "old", "blue", "happy", "quiet", "funny", "brave",
    "green", "warm", "tiny", "bright", "gentle", "sleepy", "yellow", "round", "clever",
]  # fmt: skip
ANIMALS = ["dog", "cat", "bird", "frog", "rabbit", "duck", "fox", "bear", "mouse", "owl", "goat"]
VERBS = ["jump", "sing", "dance", "run", "swim", "climb", "paint", "read", "build", "hide"]
FEELINGS = ["happy", "sad", "scared", "proud", "excited", "tired", "curious", "surprised"]
SENTENCES = [
    "One day, {n} went to the {p} with a {a} {t}.",
    "There {n} saw a {a} {an} that wanted to {v}.",
    "{n} asked the {an} if it would like to {v} together near the {p2}.",
    "The {an} said yes, and they played with the {t} until lunch.",
    "Then {n2} came by and felt very {f} about the {a2} {t2}.",
    "They decided to {v2} and share the {t} with everyone at the {p2}.",
    "After a while, the sky turned {a2} and the wind began to blow.",
    "{n2} held the {t2} tight so it would not fly away to the {p}.",
    "Mom called them home, and {n} told her about the {an} and the {t}.",
    "She smiled and said that being kind to a {an} is a {a} thing to do.",
    "That night {n} dreamed of the {p2} and a {a2} {t2} that could {v}.",
    "In the morning, {n} and {n2} went back to look for the {an} again.",
    "It was waiting by the {p2} with a {t2} in its mouth.",
    "Everyone learned that friends can {v2} together and feel {f} all day.",
]


def story(rng: random.Random) -> str:
    """A short TinyStories-like paragraph with varied words (one line)."""
    n, n2 = rng.sample(NAMES, 2)
    t, t2 = rng.sample(THINGS, 2)
    p, p2 = rng.sample(PLACES, 2)
    a, a2 = rng.sample(ADJECTIVES, 2)
    v, v2 = rng.sample(VERBS, 2)
    slots = dict(n=n, n2=n2, t=t, t2=t2, p=p, p2=p2, a=a, a2=a2, v=v, v2=v2)
    slots.update(an=rng.choice(ANIMALS), f=rng.choice(FEELINGS))
    chosen = rng.sample(SENTENCES, 9)
    return " ".join(s.format(**slots) for s in chosen)


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("prose") / "stories.jsonl"
    rows = [{"id": f"story-{i}", "text": story(rng)} for i in range(300)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_speedrun_trains_on_a_prose_corpus_with_prose_rules(stories, tmp_path):
    from lmforge.speedrun import speedrun

    settings = ["train.max_steps=10", "data.val_fraction=0.1", "data.workers=1"]
    cfg = load_config("tiny", None, [f'data.path="{stories}"', *settings])
    assert cfg.data.quality_profile == "auto"
    run = speedrun(cfg, tmp_path / "run")
    assert run.report.exists() and not run.result.interrupted
    stats = json.loads((tmp_path / "run" / "data" / "stats.json").read_text())
    assert stats["quality_profiles"] == {"prose": 300}  # every story judged by Gopher's rules
    kept = stats["documents"]["train"] + stats["documents"]["val"]
    assert kept >= 270 and stats["documents"]["val"] >= 1
    summary = (tmp_path / "run" / "data" / "pipeline" / "summary.md").read_text()
    assert "profile_prose 300" in summary and "code_" not in summary


def test_the_quality_profile_is_a_setting(stories, tmp_path):
    from lmforge.data.pipeline.corpus import clean_corpus

    cfg = load_config("tiny", None, ["data.quality_profile=prose"])
    assert cfg.data.quality_profile == "prose"
    with pytest.raises(LmforgeError, match="data.quality_profile 'poetry' is unknown: use auto"):
        load_config("tiny", None, ["data.quality_profile=poetry"])
    _, as_code = clean_corpus(str(stories), 1, tmp_path / "code", "code")
    assert as_code["quality_removed"] == {"code_mean_line_length": 300}  # the old speedrun
    _, off = clean_corpus(str(stories), 1, tmp_path / "off", "off")
    assert off["quality_removed"] == {} and off["quality_profiles"] == {}
    assert [s["name"] for s in off["pipeline"]["steps"]][1] == "pii"
