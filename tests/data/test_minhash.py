import numpy as np
import pytest

from lmforge.data.hashing import encode, fmix32, ngram_hashes, word_hashes
from lmforge.data.minhash import EMPTY, MinHasher, permutations
from lmforge.data.shingle_text import TextNormalizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.\nThe QUICK brown fox!",
    "def f(x):\n    return x + 1\n\n\nprint(f(2))",
    "",
    "   \n\t  ",
    "one two",
    "café naïve 日本語 words\x00with\x1fcontrol bytes",
]


def reference_words(text: str) -> list[bytes]:
    """The module's word definition: runs of bytes above 0x20, ASCII lowercased."""
    data = text.encode().lower()
    return data.translate(bytes(b if b > 32 else 32 for b in range(256))).split()


def test_word_hashes_follow_the_word_definition():
    buf, starts = encode(TEXTS)
    hashes, offsets = word_hashes(buf, starts)
    words = [reference_words(t) for t in TEXTS]
    assert np.diff(offsets).tolist() == [len(w) for w in words]
    seen: dict[bytes, int] = {}
    for word, h in zip([w for ws in words for w in ws], hashes.tolist(), strict=True):
        assert seen.setdefault(word, h) == h  # same word, same hash, wherever it is
    assert len(set(seen.values())) == len(seen)  # different words, different hashes
    upper, _ = word_hashes(*encode(["QUICK"]), lowercase=False)
    lower, _ = word_hashes(*encode(["quick"]), lowercase=False)
    assert upper[0] != lower[0]


def test_ngram_hashes_cover_each_text_separately():
    texts = ["a b c d e f g", "a b c", "", "c d e f g"]
    words, offsets = word_hashes(*encode(texts))
    grams, gram_offsets = ngram_hashes(words, offsets, 5)
    assert np.diff(gram_offsets).tolist() == [3, 1, 0, 1]  # a short text is one whole shingle
    g = [grams[gram_offsets[i] : gram_offsets[i + 1]].tolist() for i in range(4)]
    assert g[0][2] == g[3][0]  # "c d e f g" in both texts
    assert g[1][0] not in g[0]
    _, drop_offsets = ngram_hashes(words, offsets, 5, short="drop")
    assert np.diff(drop_offsets).tolist() == [3, 0, 0, 1]
    with pytest.raises(ValueError, match="at least 1"):
        ngram_hashes(words, offsets, 0)


def test_permutations_are_datasketchs_affine32_for_the_seed():
    a, b = permutations(128, seed=1)  # values datasketch 2.0 MinHash(128, seed=1) holds
    assert a[:4].tolist() == [3582191691, 4270784983, 1892572953, 3715639441]
    assert b[:4].tolist() == [214548472, 3287733501, 2301657549, 194758406]
    assert (a % 2 == 1).all()


def test_signatures_equal_a_per_text_reference():
    hasher = MinHasher(num_perm=64, ngram=3, seed=7)
    sigs = hasher.signatures(TEXTS)
    grams, offsets = hasher.shingles(TEXTS)
    for i in range(len(TEXTS)):
        h = fmix32(grams[offsets[i] : offsets[i + 1]].astype(np.uint32))
        if len(h) == 0:
            assert (sigs[i] == EMPTY).all()
            continue
        with np.errstate(over="ignore"):
            expected = (hasher.a[None, :] * h[:, None] + hasher.b[None, :]).min(axis=0)
        assert np.array_equal(sigs[i], expected)


def test_signatures_do_not_depend_on_grouping_or_blocks():
    rng = np.random.default_rng(0)
    texts = [" ".join(map(str, rng.integers(0, 500, rng.integers(0, 400)))) for _ in range(60)]
    whole = MinHasher(num_perm=32).signatures(texts)
    pieces = MinHasher(num_perm=32, group_bytes=300, block=7).signatures(texts)
    assert np.array_equal(whole, pieces)


def test_signature_agreement_estimates_jaccard():
    rng = np.random.default_rng(1)
    base = rng.integers(0, 10**6, 2000).astype(str).tolist()
    other = base[:1500] + rng.integers(0, 10**6, 500).astype(str).tolist()
    hasher = MinHasher(num_perm=256, ngram=1)
    sigs = hasher.signatures([" ".join(base), " ".join(other)])
    true = 1500 / 2500
    assert abs(MinHasher.jaccard_estimate(sigs[0], sigs[1]) - true) < 0.08


def test_long_buffers_are_hashed_in_slices_with_the_same_result(monkeypatch):
    import lmforge.data.hashing as hashing

    rng = np.random.default_rng(2)
    texts = [" ".join(rng.integers(0, 1000, rng.integers(0, 300)).astype(str)) for _ in range(50)]
    whole = word_hashes(*encode(texts))
    monkeypatch.setattr(hashing, "_SLICE_BYTES", 1000)
    sliced = word_hashes(*encode(texts))
    assert np.array_equal(whole[0], sliced[0]) and np.array_equal(whole[1], sliced[1])
    pieces, _ = word_hashes(*encode(["x" * 2500]))
    assert len(pieces) == 3  # a word longer than a slice is cut, never lost


def test_normalize_runs_before_shingling_and_is_off_by_default():
    texts = ["Crème brûlée, of course! " * 4, "creme brulee of course " * 4]
    raw = MinHasher(num_perm=32).signatures(texts)
    normalized = MinHasher(num_perm=32, normalize=TextNormalizer()).signatures(texts)
    assert not np.array_equal(raw[0], raw[1])
    assert np.array_equal(normalized[0], normalized[1])
    assert np.array_equal(MinHasher(num_perm=32).signatures(texts[1:]), raw[1:])
