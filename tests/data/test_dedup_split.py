from collections import Counter

from lmforge.data import Document, ExactDedup, is_validation, normalize, split_score


def test_normalize_ignores_trailing_whitespace_and_outer_blank_lines():
    assert normalize("a  \nb\t\n\n") == normalize("\n\na\nb") == "a\nb"
    assert normalize("a b") != normalize("ab")
    assert normalize("e\u0301") == normalize("\u00e9")  # NFC


def test_exact_dedup_keeps_first_occurrence_and_counts_removed():
    docs = [
        Document("1", "x = 1\n"),
        Document("2", "y = 2"),
        Document("3", "x = 1   \n\n"),
        Document("4", "x = 1"),
        Document("5", "Y = 2"),
    ]
    dedup = ExactDedup()
    kept = list(dedup(docs))
    assert [d.id for d in kept] == ["1", "2", "5"]
    assert dedup.removed == 2


def test_split_is_stable_and_near_the_fraction():
    ids = [f"doc-{i}" for i in range(20000)]
    chosen = [i for i in ids if is_validation(i, 0.1)]
    assert 1700 < len(chosen) < 2300
    assert chosen == [i for i in reversed(ids) if is_validation(i, 0.1)][::-1]
    assert all(0 <= split_score(i) < 1 for i in ids[:100])
    # nested: a larger fraction keeps every id a smaller one chose
    assert set(chosen) <= {i for i in ids if is_validation(i, 0.2)}
    assert Counter(is_validation(i, 0.0) for i in ids)[True] == 0
