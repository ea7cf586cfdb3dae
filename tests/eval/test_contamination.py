import numpy as np
import pytest

from lmforge.errors import LmforgeError
from lmforge.eval.contamination import NgramIndex, contamination

TRAIN_WORDS = [f"train{i}" for i in range(60)]
OTHER_WORDS = [f"other{i}" for i in range(40)]
TRAIN_DOCS = [
    " ".join(TRAIN_WORDS),
    "def add_one(x):\n    return x + 1  # a short function, but over thirteen words long\n",
    "five words only here ok",
]


@pytest.fixture(scope="module")
def index():
    return NgramIndex(TRAIN_DOCS)


def words(*parts):
    return " ".join(w for part in parts for w in part)


def test_a_copied_example_is_flagged_and_an_unrelated_one_is_not(index):
    assert index.contains_any(TRAIN_DOCS[0])
    assert index.contains_any(words(OTHER_WORDS[:5], TRAIN_WORDS[20:45], OTHER_WORDS[5:10]))
    assert not index.contains_any(words(OTHER_WORDS))
    assert not index.contains_any("The quick brown fox jumps over the lazy dog, again and again.")


def test_one_shared_13_gram_is_flagged_a_shared_12_gram_is_not(index):
    one = words(OTHER_WORDS[:10], TRAIN_WORDS[10:23], OTHER_WORDS[10:20])
    assert index.matching_ngrams(one) == 1
    assert index.contains_any(one)
    twelve = words(OTHER_WORDS[:10], TRAIN_WORDS[10:22], OTHER_WORDS[10:20])
    assert index.matching_ngrams(twelve) == 0
    assert not index.contains_any(twelve)
    # 20 consecutive training words hold 20 - 13 + 1 = 8 of its 13-grams.
    assert index.matching_ngrams(words(TRAIN_WORDS[30:50])) == 8


def test_case_whitespace_and_punctuation_changes_still_match(index):
    passage = TRAIN_WORDS[5:25]
    shouted = "\n\n  ".join(w.upper() + "," for w in passage) + "!"
    assert index.matching_ngrams(shouted) == index.matching_ngrams(words(passage)) == 8
    reformatted = "DEF add_one( x ):\n\treturn x+1 # A short function,  but over 13 words"
    assert not index.contains_any(reformatted)  # "13" is not "thirteen"
    reformatted = reformatted.replace("13 words", "thirteen words LONG")
    assert index.contains_any(reformatted)


def test_texts_under_n_words_match_only_as_a_whole(index):
    assert index.matching_ngrams("Five words ONLY here, ok.") == 1
    assert not index.contains_any("five words only here")
    assert not index.contains_any(words(TRAIN_WORDS[:12]))  # inside a long document
    assert not index.contains_any("")
    assert not index.contains_any(" ,.;- ")


def test_the_fraction_over_a_mixed_list_is_exact(index):
    examples = [
        words(OTHER_WORDS[:20]),
        words(TRAIN_WORDS[:13]),
        words(OTHER_WORDS[3:30]),
        words(OTHER_WORDS[:4], TRAIN_WORDS[40:60]),
        "",
        words(TRAIN_WORDS[0:12], OTHER_WORDS[:12]),
        TRAIN_DOCS[1],
        words(OTHER_WORDS[20:]),
    ]
    result = contamination(index, examples)
    assert result.contaminated_indices == (1, 3, 6)
    assert (result.n_contaminated, result.n_examples) == (3, 8)
    assert result.fraction == 3 / 8
    assert contamination(index, []).fraction == 0.0


def test_save_and_load_give_the_same_answers(index, tmp_path):
    path = tmp_path / "train.ngrams.npz"
    index.save(path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    loaded = NgramIndex.load(path)
    assert (loaded.n, loaded.capacity, loaded.num_ngrams) == (index.n, index.capacity, 52)
    probes = [TRAIN_DOCS[0], words(TRAIN_WORDS[10:22], OTHER_WORDS), "five words only here ok"]
    probes += [words(OTHER_WORDS[i : i + 15]) for i in range(20)]
    np.testing.assert_array_equal(loaded.matching_counts(probes), index.matching_counts(probes))
    np.testing.assert_array_equal(loaded.bloom.bits, index.bloom.bits)
    (tmp_path / "bad.npz").write_bytes(b"not an index")
    with pytest.raises(LmforgeError, match="not an n-gram index"):
        NgramIndex.load(tmp_path / "bad.npz")


def test_streaming_with_a_capacity_and_adding_later_agree():
    sized = NgramIndex(TRAIN_DOCS, capacity=10_000)
    later = NgramIndex([])
    for doc in TRAIN_DOCS:
        later.add(doc)
    probes = [TRAIN_DOCS[0], words(TRAIN_WORDS[10:23], OTHER_WORDS), words(OTHER_WORDS)]
    assert sized.matching_counts(probes).tolist() == [48, 1, 0]
    assert later.matching_counts(probes).tolist() == [48, 1, 0]
    assert sized.expected_fp_rate() < sized.fp_rate
    with pytest.raises(ValueError, match="at least 1"):
        NgramIndex(TRAIN_DOCS, n=0)


def test_a_smaller_n_is_honoured():
    index = NgramIndex(TRAIN_DOCS, n=5)
    assert index.contains_any(words(OTHER_WORDS[:9], TRAIN_WORDS[7:12]))
    assert not index.contains_any(words(OTHER_WORDS[:9], TRAIN_WORDS[7:11]))
