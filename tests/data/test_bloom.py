import math

import numpy as np
import pytest

from lmforge.data.bloom import BloomFilter, item_hashes, optimal_size


def test_sizing_follows_the_formulas():
    bits, hashes = optimal_size(1_000_000, 0.01)
    assert abs(bits - 1_000_000 * math.log(100) / math.log(2) ** 2) <= 8
    assert hashes == 7
    assert optimal_size(1000, 0.001)[1] == 10
    with pytest.raises(ValueError, match="fp_rate"):
        optimal_size(10, 1.5)


@pytest.mark.parametrize("fp_rate", [0.01, 0.05])
def test_no_false_negatives_and_false_positives_as_theory_says(fp_rate):
    n, queries = 20_000, 200_000
    bloom = BloomFilter(n, fp_rate)
    members = item_hashes(f"member-{i}" for i in range(n))
    assert not bloom.add_hashes(*members).any()
    assert bloom.contains_hashes(*members).all()
    measured = bloom.contains_hashes(*item_hashes(f"other-{i}" for i in range(queries))).mean()
    expected = bloom.expected_fp_rate()
    assert expected == pytest.approx(fp_rate, rel=0.05)
    # 200k queries: one standard deviation is under 3 % of the rate; allow 15 %.
    assert measured == pytest.approx(expected, rel=0.15)
    assert measured == pytest.approx(bloom.fill_ratio() ** bloom.num_hashes, rel=0.15)


def test_add_reports_earlier_items_including_repeats_in_a_batch():
    bloom = BloomFilter(100, 0.001)
    assert bloom.add("x") is False
    assert bloom.add(b"x") is True  # str is hashed as its UTF-8 bytes
    assert "x" in bloom and "y" not in bloom
    present = bloom.add_hashes(*item_hashes(["a", "b", "a", "x", "b"]))
    assert present.tolist() == [False, False, True, True, True]
    assert bloom.count == 3


def test_union_intersection_and_save_load(tmp_path):
    a, b = BloomFilter(1000, 0.01), BloomFilter(1000, 0.01)
    for i in range(300):
        a.add(f"a{i}")
        b.add(f"b{i}")
    a.add("both")
    b.add("both")
    union, common = a | b, a & b
    assert all(f"a{i}" in union and f"b{i}" in union for i in range(300))
    assert "both" in common
    assert np.mean([f"a{i}" in common for i in range(300)]) < 0.2
    a.save(tmp_path / "a.npz")
    loaded = BloomFilter.load(tmp_path / "a.npz")
    assert np.array_equal(loaded.bits, a.bits) and loaded.count == a.count
    assert all(f"a{i}" in loaded for i in range(300))
    with pytest.raises(ValueError, match="same size"):
        _ = a | BloomFilter(10, 0.01)
