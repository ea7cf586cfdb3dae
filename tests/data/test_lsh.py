import numpy as np
import pytest

from lmforge.data.lsh import LSHIndex, candidate_probability, optimal_bands
from lmforge.data.minhash import EMPTY

# (bands, rows) that datasketch.MinHashLSH chooses with its default weights.
DATASKETCH_CHOICES = {
    (0.5, 128): (25, 5),
    (0.7, 128): (14, 9),
    (0.8, 128): (9, 13),
    (0.9, 128): (5, 25),
    (0.8, 256): (17, 15),
    (0.3, 128): (37, 3),
}


@pytest.mark.parametrize(("threshold", "num_perm"), sorted(DATASKETCH_CHOICES))
def test_band_choice_matches_datasketch(threshold, num_perm):
    assert optimal_bands(threshold, num_perm) == DATASKETCH_CHOICES[threshold, num_perm]


def test_describe_prints_the_choice_and_its_s_curve():
    text = LSHIndex(0.8, 128).describe()
    assert "9 bands x 13 rows" in text and "threshold 0.80" in text
    assert "0.399" in text  # P(candidate | J = 0.8) = 1 - (1 - 0.8^13)^9


def test_candidate_rate_follows_the_s_curve():
    """Signature pairs agreeing independently on each value with probability J."""
    rng = np.random.default_rng(0)
    index = LSHIndex(0.8, 128)
    for j in (0.6, 0.8, 0.9):
        a = rng.integers(0, 2**32 - 1, (3000, 128), dtype=np.uint32)
        b = np.where(rng.random(a.shape) < j, a, a ^ np.uint32(1))
        pairs = index.candidate_pairs(np.concatenate([a, b]))
        found = {(i, k) for i, k in pairs.tolist()}
        rate = np.mean([(i, i + 3000) in found for i in range(3000)])
        assert abs(rate - candidate_probability(j, index.bands, index.rows)) < 0.03


def test_candidate_pairs_and_streaming_queries_agree():
    rng = np.random.default_rng(1)
    sigs = rng.integers(0, 2**32 - 1, (50, 128), dtype=np.uint32)
    sigs[10] = sigs[3]
    sigs[20, :13] = sigs[3, :13]  # shares exactly the first band with 3
    sigs[30:33] = sigs[5]
    sigs[40] = EMPTY
    sigs[41] = EMPTY
    index = LSHIndex(0.8, 128)
    pairs = index.candidate_pairs(sigs).tolist()
    assert pairs == [[3, 10], [3, 20], [5, 30], [5, 31], [5, 32], [10, 20], [30, 31], [30, 32],
                     [31, 32]]  # fmt: skip
    for key, sig in enumerate(sigs):
        index.insert(key, sig)
    assert index.query(sigs[3]) == [3, 10, 20]
    assert index.query(sigs[40]) == []


def test_large_buckets_pair_with_their_first_member_only():
    sigs = np.zeros((100, 128), dtype=np.uint32)
    pairs = LSHIndex(0.8, 128, max_bucket_pairs=10).candidate_pairs(sigs)
    assert pairs.tolist() == [[0, k] for k in range(1, 100)]


def test_explicit_bands_are_checked():
    assert LSHIndex(bands=4, rows=32, num_perm=128).bands == 4
    with pytest.raises(ValueError, match="more than 128"):
        LSHIndex(bands=10, rows=13, num_perm=128)
    with pytest.raises(ValueError, match="both"):
        LSHIndex(bands=10)
