import numpy as np
import pytest

from lmforge.tokens.blend import assign, normalized


@pytest.mark.parametrize("weights", [[7, 3], [2, 1, 1], [0.9, 0.05, 0.05], [1]])
def test_every_prefix_stays_within_one_sequence_of_its_share(weights):
    w = normalized(weights)
    choice = assign(w, [0] * len(w), 1000)
    counts = np.cumsum(np.eye(len(w), dtype=np.int64)[choice], axis=0)
    expected = np.arange(1, 1001)[:, None] * w
    assert np.abs(counts - expected).max() < 1


def test_assignment_continues_from_the_counts_alone():
    w = normalized([0.6, 0.3, 0.1])
    whole = assign(w, [0, 0, 0], 50)
    head = assign(w, [0, 0, 0], 17)
    taken = np.bincount(head, minlength=3).tolist()
    assert np.array_equal(np.concatenate([head, assign(w, taken, 33)]), whole)
