import numpy as np
import pytest

from lmforge.data.near_dedup import (
    NearDedup,
    clusters_from_pairs,
    find_near_duplicates,
    jaccard,
    near_duplicate_clusters,
)
from lmforge.data.planted import KINDS, pair_scores, planted_corpus
from lmforge.data.shingle_text import TextNormalizer


@pytest.fixture(scope="module")
def corpus():
    # 5-10 % of words edited: Jaccard 0.42-0.63 of 5-gram shingles to the base (see planted.py).
    return planted_corpus(n_base=300, words=(150, 400), vocab_size=5000, seed=3)


def test_planted_near_duplicates_are_found(corpus):
    found = find_near_duplicates(corpus.texts, threshold=0.3)
    precision, recall = pair_scores(found.clusters, corpus.groups)
    assert precision >= 0.95 and recall >= 0.95, (precision, recall)
    assert found.verified_pairs <= found.candidate_pairs
    for cluster in found.clusters:
        assert found.keep[cluster[0]] and not found.keep[cluster[1:]].any()
    assert found.removed == sum(len(c) - 1 for c in found.clusters)


def test_verification_rejects_what_lsh_lets_through(corpus):
    loose = near_duplicate_clusters(corpus.texts, threshold=0.3, verify="none")
    exact = near_duplicate_clusters(corpus.texts, threshold=0.9)
    assert pair_scores(exact, corpus.groups)[0] == 1.0
    assert sum(map(len, exact)) < sum(map(len, loose))


def test_streaming_drops_only_what_the_batch_drops(corpus):
    batch = find_near_duplicates(corpus.texts, threshold=0.3)
    stream = NearDedup(threshold=0.3)
    keep = np.concatenate(
        [stream.add_batch(corpus.texts[:100]), stream.add_batch(corpus.texts[100:])]
    )
    assert not (batch.keep & ~keep).any()
    # The stream cannot link two copies that arrive before their base (Jaccard 0.2-0.4 to each
    # other); the base then joins one of them and the other copy has already been kept.
    assert keep.sum() - batch.keep.sum() <= 0.1 * len(keep)
    assert pair_scores(stream.clusters(), corpus.groups)[0] >= 0.95
    one_by_one = NearDedup(threshold=0.3, verify="signature")
    assert [one_by_one.add(t) for t in corpus.texts[:60]] == NearDedup(
        threshold=0.3, verify="signature"
    ).add_batch(corpus.texts[:60]).tolist()


def test_exact_copies_and_empty_texts():
    texts = ["a b c d e f g h", "", "A b c d e f g h", "unrelated words here and there", ""]
    assert near_duplicate_clusters(texts) == [[0, 2]]
    dedup = NearDedup()
    assert [dedup.add(t) for t in texts] == [True, True, False, True, True]
    assert dedup.removed == 1 and dedup.matches == [(2, 0)]


def test_jaccard_and_union_find():
    a, b = np.array([1, 2, 3, 4], np.uint64), np.array([3, 4, 5], np.uint64)
    assert jaccard(a, b) == pytest.approx(2 / 5)
    assert jaccard(a, np.array([], np.uint64)) == 0.0
    assert clusters_from_pairs([(5, 7), (1, 2), (7, 9), (2, 3)]) == [[1, 2, 3], [5, 7, 9]]
    assert clusters_from_pairs(np.array([[4, 0]])) == [[0, 4]]


def test_bad_verify_mode_is_rejected():
    with pytest.raises(ValueError, match="verify must be"):
        NearDedup(verify="maybe")


@pytest.fixture(scope="module")
def variants():
    # Copies that differ from their base only in punctuation, accents or no-break spaces.
    return planted_corpus(
        n_base=200, words=(100, 300), vocab_size=5000, seed=5, kinds=KINDS[1:], max_copies=2
    )


@pytest.mark.parametrize("kind", KINDS[1:])
def test_form_only_copies_are_found_with_normalization_and_not_without(variants, kind):
    groups = variants.of_kind(kind)
    assert groups
    normalized = find_near_duplicates(variants.texts, threshold=0.8)
    assert pair_scores(normalized.clusters, groups)[1] == 1.0
    assert pair_scores(normalized.clusters, variants.groups)[0] == 1.0
    # Raw text: words split on ASCII whitespace only and compared byte for byte, so "word," and
    # "word", "é" and "e", "a\u00a0b" and "a b" are different words; about half the words (or
    # spaces) differ, so almost no 5-gram survives and the Jaccard similarity is below 0.1.
    raw = find_near_duplicates(variants.texts, threshold=0.8, normalize=False)
    assert pair_scores(raw.clusters, groups)[1] == 0.0
    streamed = NearDedup(threshold=0.8)
    keep = streamed.add_batch(variants.texts)
    assert keep.tolist() == normalized.keep.tolist()


def test_normalization_can_be_chosen_step_by_step():
    base = "the quick brown fox jumps over the lazy dog near the river bank today " * 3
    accented = base.replace("o", "ö")
    keep_accents = TextNormalizer(strip_accents=False)
    assert near_duplicate_clusters([base, accented], normalize=True) == [[0, 1]]
    assert near_duplicate_clusters([base, accented], normalize=keep_accents) == []
    dedup = NearDedup(normalize=keep_accents)
    assert dedup.add_batch([base, accented.upper().replace("Ö", "ö")]).tolist() == [True, True]
    assert NearDedup(normalize=TextNormalizer()).add_batch([base, accented]).tolist() == [
        True,
        False,
    ]
    with pytest.raises(TypeError, match="TextNormalizer"):
        find_near_duplicates([base], normalize="yes")


def test_bands_and_rows_are_honoured_and_reported(corpus):
    auto = find_near_duplicates(corpus.texts, threshold=0.3)
    assert (auto.bands, auto.rows) == (37, 3)  # datasketch's choice for 0.3 and 128
    # One band of 64 rows: only pairs agreeing on all 64 values, so the 0.42-0.63 copies are
    # almost never candidates; 64 bands of 2 rows: more candidates, more of them true pairs.
    strict = find_near_duplicates(corpus.texts, threshold=0.3, bands=1, rows=64)
    loose = find_near_duplicates(corpus.texts, threshold=0.3, bands=64, rows=2)
    assert (strict.bands, strict.rows, loose.bands, loose.rows) == (1, 64, 64, 2)
    assert strict.candidate_pairs < 0.05 * auto.candidate_pairs
    assert loose.candidate_pairs > auto.candidate_pairs
    assert loose.verified_pairs > auto.verified_pairs
    assert pair_scores(strict.clusters, corpus.groups)[1] < 0.1
    stream = NearDedup(threshold=0.3, bands=1, rows=64)
    assert (stream.index.bands, stream.index.rows) == (1, 64)
    assert stream.add_batch(corpus.texts).all() == (strict.removed == 0)


@pytest.mark.parametrize(
    ("bands", "rows", "message"),
    [
        (9, None, "bands=9 without the other: give both bands and rows, or neither"),
        (None, 13, "rows=13 without the other"),
        (0, 13, "bands must be a positive integer, got 0"),
        (10, 13, "10 bands x 13 rows = 130 values need more than 128 permutations: lower"),
    ],
)
def test_bad_banding_is_rejected_with_the_fix(bands, rows, message):
    with pytest.raises(ValueError, match=message) as error:
        find_near_duplicates(["a b c"], bands=bands, rows=rows)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=message):
        NearDedup(bands=bands, rows=rows)
