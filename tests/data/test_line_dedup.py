import pytest

from lmforge.data.line_dedup import LineCounter, LineDedup

BOILER = "Copyright 2024 Example Corp. All rights reserved."
DOCS = [
    f"First article about rivers and bridges.\n{BOILER}\n\n}}\nshort\n",
    f"Second article, about trains.\r\n   {BOILER}   \r\n}}\nshort\nIt ends here.",
    "Third article mentions trains twice.\nThird article mentions trains twice.\n",
    "Nothing repeated in this one at all.\n",
]


def counters():
    return [LineCounter(min_chars=10), LineCounter.bloom(capacity=1000, fp_rate=1e-4, min_chars=10)]


@pytest.mark.parametrize("counter", counters(), ids=["exact", "bloom"])
def test_repeated_lines_are_removed_everywhere_short_lines_kept(counter):
    for doc in DOCS:
        counter.add(doc)
    dedup = counter.finish()
    assert [dedup.apply(d) for d in DOCS] == [
        "First article about rivers and bridges.\n\n}\nshort\n",
        "Second article, about trains.\r\n}\nshort\nIt ends here.",
        "",
        "Nothing repeated in this one at all.\n",
    ]
    assert dedup.removed_lines == 4
    assert counter.lines == 8


@pytest.mark.parametrize("kind", ["exact", "bloom"])
def test_merged_counters_equal_one_counter_and_survive_save_load(kind, tmp_path):
    one, left, right = (counters()[kind == "bloom"] for _ in range(3))
    for i, doc in enumerate(DOCS):
        one.add(doc)
        (left if i % 2 else right).add(doc)
    left.merge(right)
    path = tmp_path / "lines.npz"
    left.finish().save(path)
    loaded = LineDedup.load(path)
    expected = one.finish()
    assert [loaded.apply(d) for d in DOCS] == [expected.apply(d) for d in DOCS]


def test_bloom_counting_at_scale_rarely_removes_unique_lines():
    unique = [f"unique line number {i} of the corpus" for i in range(20000)]
    counter = LineCounter.bloom(capacity=25000, fp_rate=0.01, min_chars=5)
    counter.add("\n".join(unique) + f"\n{BOILER}")
    counter.add(BOILER)
    dedup = counter.finish()
    kept = dedup.apply("\n".join(unique)).splitlines()
    assert len(kept) >= 0.97 * len(unique)
    assert dedup.apply(BOILER) == ""


@pytest.mark.parametrize("counter", counters(), ids=["exact", "bloom"])
def test_texts_without_countable_lines(counter):
    for text in ("", "\n\n", "short\nlines"):
        counter.add(text)
    dedup = counter.finish()
    assert [dedup.apply(t) for t in ("", "short\nshort\n")] == ["", "short\nshort\n"]


def test_mismatched_counters_do_not_merge():
    with pytest.raises(ValueError, match="same kind"):
        LineCounter().merge(LineCounter.bloom(100))
