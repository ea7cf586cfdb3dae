import numpy as np
import pytest

from lmforge.data.near_dedup import (
    NearDedup,
    clusters_from_pairs,
    find_near_duplicates,
    jaccard,
    near_duplicate_clusters,
)
from lmforge.data.planted import pair_scores, planted_corpus


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
