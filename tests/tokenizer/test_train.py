"""Training: equal to a naive reference trainer, tie rule, special tokens, sizes, determinism."""

import json
import random
import subprocess
import sys
import tracemalloc
from collections import Counter
from itertools import pairwise

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.errors import LmforgeError
from lmforge.tokenizer import GPT2_PATTERN, GPT4_PATTERN, InputStats, train_bpe, train_bpe_files

EOT = "<|endoftext|>"


def reference_train(texts, vocab_size, specials, pattern=GPT2_PATTERN):
    """Naive BPE training: recount every pair each merge; ties go to the greatest byte pair."""
    split = regex.compile("|".join(regex.escape(s) for s in sorted(specials, key=len)[::-1]))
    words = Counter()
    for text in texts:
        for piece in split.split(text) if specials else [text]:
            for pre in regex.findall(pattern, piece):
                words[tuple(bytes([b]) for b in pre.encode("utf-8"))] += 1
    vocab = [bytes([b]) for b in range(256)]
    merges = []
    while len(vocab) + len(specials) < vocab_size:
        pairs = Counter()
        for word, freq in words.items():
            for pair in pairwise(word):
                pairs[pair] += freq
        if not pairs:
            break
        a, b = max(pairs, key=lambda p: (pairs[p], p))
        merged_words = Counter()
        for word, freq in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged_words[tuple(out)] += freq
        words = merged_words
        if a + b not in vocab:
            vocab.append(a + b)
            merges.append((a, b))
    return vocab, merges


def ranks_of(vocab):
    return {token: i for i, token in enumerate(vocab)}


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.text(alphabet="aab c\n\té<|>", max_size=40), max_size=8),
    extra=st.integers(1, 60),
)
def test_matches_reference_trainer_small_alphabet(texts, extra):
    vocab_size = 256 + extra + 1
    tok = train_bpe(texts, vocab_size, special_tokens=[EOT])
    vocab, merges = reference_train(texts, vocab_size, [EOT])
    assert tok.merges == merges
    assert tok.mergeable_ranks == ranks_of(vocab)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("pattern", [GPT2_PATTERN, GPT4_PATTERN])
def test_matches_reference_trainer_random_corpora(seed, pattern):
    rng = random.Random(seed)
    words = ["def", "self", " the", "  ", "\n", "x", "ab", "ba", "aaa", EOT, "123", "é", "日本"]
    texts = ["".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(30)]
    specials = [EOT, "<|pad|>"]
    tok = train_bpe(texts, 256 + 80 + len(specials), specials, pattern)
    vocab, merges = reference_train(texts, 256 + 80 + len(specials), specials, pattern)
    assert tok.merges == merges
    assert tok.mergeable_ranks == ranks_of(vocab)


def test_tie_break_prefers_greatest_pair():
    # "ab" and "cd" occur once each: (c, d) > (a, b), so it merges first.
    tok = train_bpe(["ab", "cd"], 256 + 2 + 1)
    assert tok.merges == [(b"c", b"d"), (b"a", b"b")]
    # (b, c) occurs 4 times; then (a, bc) and (a, b) tie once each; b"bc" > b"b".
    tok = train_bpe(["bc", "bc", "bc", "abc", "ab"], 256 + 2 + 1)
    assert tok.merges == [(b"b", b"c"), (b"a", b"bc")]


def test_vocab_size_exact_and_special_ids(corpus):
    specials = [EOT, "<|pad|>", "<|im_start|>"]
    tok = train_bpe(corpus, 300, specials)
    assert tok.vocab_size == 300
    assert len(tok.mergeable_ranks) == 300 - len(specials)
    assert sorted(tok.mergeable_ranks.values()) == list(range(297))
    assert all(tok.mergeable_ranks[bytes([b])] == b for b in range(256))
    assert tok.special_tokens == {s: 297 + i for i, s in enumerate(specials)}
    assert tok.eot_id == 297


def test_stops_early_when_no_pairs_left():
    tok = train_bpe(["abab"], 1000)
    assert tok.merges == [(b"a", b"b"), (b"ab", b"ab")]
    assert tok.vocab_size == 256 + 2 + 1


def test_never_merges_across_special_tokens():
    texts = [f"x{EOT}x{EOT}y<|pad|>y"] * 50
    tok = train_bpe(texts, 400, [EOT, "<|pad|>"])
    assert not any(b"<" in t or b">" in t for t in tok.mergeable_ranks if len(t) > 1)
    ids = tok.encode(texts[0], allowed_special="all")
    assert ids.count(tok.eot_id) == 2
    assert tok.special_tokens["<|pad|>"] in ids
    assert tok.decode(ids) == texts[0]


def test_too_small_vocab_raises():
    with pytest.raises(LmforgeError, match="vocab_size"):
        train_bpe(["abc"], 256, [EOT])


def test_deterministic_across_processes(corpus):
    code = (
        "from lmforge.tokenizer import train_bpe\n"
        f"print(train_bpe({corpus!r} * 3, 500).fingerprint())\n"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "LMFORGE_PROGRESS": "0"},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert runs == {train_bpe(corpus * 3, 500).fingerprint()}


def test_empty_special_token_raises():
    with pytest.raises(LmforgeError, match="empty"):
        train_bpe(["abc"], 300, [EOT, ""])
    with pytest.raises(LmforgeError, match="list"):
        train_bpe(["abc"], 300, EOT)


def folder_bytes(tok, folder):
    tok.save(folder)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def source_files(stdlib_texts, tmp_path_factory):
    """Real source as a .txt file (one text) and a .jsonl file (one text per line)."""
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "all.txt").write_text(EOT.join(stdlib_texts), encoding="utf-8")
    lines = [json.dumps({"id": str(i), "text": t}) for i, t in enumerate(stdlib_texts)]
    (folder / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_same_result_whatever_the_worker_count(source_files, tmp_path):
    runs = [
        folder_bytes(
            train_bpe_files([source_files], 1000, [EOT], workers=w, chunk_bytes=16_000),
            tmp_path / f"w{w}",
        )
        for w in (1, 2, 3)
    ]
    assert runs[0] == runs[1] == runs[2]
    assert set(runs[0]) == {
        "vocab.json",
        "merges.txt",
        "tokenizer.json",
        "tokenizer.tiktoken",
        "lmforge_tokenizer.json",
    }


def test_chunked_files_train_as_if_whole(source_files, stdlib_texts):
    # The .txt file is cut into many chunks, the .jsonl file into blocks of lines; the result
    # equals training on the texts in memory: the .txt as one text, the .jsonl lines each alone.
    whole = EOT.join(stdlib_texts)
    expected = train_bpe([whole, *stdlib_texts], 900, [EOT], workers=1)
    got = train_bpe_files([source_files], 900, [EOT], workers=2, chunk_bytes=5_000)
    assert got.merges == expected.merges
    assert got.fingerprint() == expected.fingerprint()


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_chunked_texts_equal_unchunked(stdlib_texts, pattern):
    # Long in-memory texts are cut at cut points only: counting is unchanged by chunking.
    one = train_bpe(stdlib_texts, 700, [EOT], pattern, workers=1, chunk_bytes=10**9)
    many = train_bpe(stdlib_texts, 700, [EOT], pattern, workers=1, chunk_bytes=3_000)
    assert many.merges == one.merges


def test_invalid_utf8_is_replaced_or_skipped_and_counted(tmp_path, capsys):
    (tmp_path / "a.txt").write_bytes(b"hello \xff\xfe world \xe6\x97 x " * 50 + "日本".encode())
    (tmp_path / "b.txt").write_bytes("clean text é".encode())
    stats = InputStats()
    tok = train_bpe_files([tmp_path], 300, [EOT], workers=1, chunk_bytes=64, stats=stats)
    # Counted as Python's "replace" does: \xff and \xfe one each, the cut-short \xe6\x97 one.
    assert stats.invalid_utf8 == 150
    assert stats.files == 2 and stats.invalid_files == [str(tmp_path / "a.txt")]
    assert "\ufffd".encode() in tok.mergeable_ranks or any(
        b"\xef\xbf\xbd" in t for t in tok.mergeable_ranks
    )
    assert "150 invalid UTF-8" in capsys.readouterr().err
    skipped = InputStats()
    tok = train_bpe_files([tmp_path], 300, [EOT], invalid_utf8="skip", stats=skipped)
    assert skipped.invalid_utf8 == 150
    assert not any(b"\xef\xbf\xbd" in t for t in tok.mergeable_ranks)


def test_multibyte_characters_across_read_blocks_are_not_invalid(tmp_path):
    (tmp_path / "cjk.txt").write_text("日本語のテキスト " * 200, encoding="utf-8")
    stats = InputStats()
    train_bpe_files([tmp_path / "cjk.txt"], 300, [EOT], chunk_bytes=7, stats=stats)
    assert stats.invalid_utf8 == 0 and stats.bytes == (tmp_path / "cjk.txt").stat().st_size


def test_bad_inputs_raise(tmp_path):
    with pytest.raises(LmforgeError, match="does not exist"):
        train_bpe_files([tmp_path / "missing.txt"], 300)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LmforgeError, match="no .txt or .jsonl"):
        train_bpe_files([tmp_path / "empty"], 300)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n\n{"text": "fine"}\n{oops}\n', "utf-8")
    with pytest.raises(LmforgeError, match=r"bad\.jsonl:4 "):
        train_bpe_files([tmp_path / "bad.jsonl"], 300, workers=1)
    with pytest.raises(LmforgeError, match=r"bad\.jsonl:4 "):
        train_bpe_files([tmp_path / "bad.jsonl"] * 3, 300, workers=2, chunk_bytes=8)
    with pytest.raises(LmforgeError, match="vocab_size"):
        train_bpe_files([tmp_path / "bad.jsonl"], 200)


def test_max_bytes_limits_the_input(source_files):
    small = train_bpe_files([source_files / "all.txt"], 5000, [EOT], max_bytes=20_000)
    full = train_bpe_files([source_files / "all.txt"], 5000, [EOT], max_bytes=0)
    assert small.vocab_size < full.vocab_size  # ran out of pairs on the small input


def test_training_memory_does_not_grow_with_the_file(tmp_path):
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "x", "(", ")", "12", "é", EOT, "\n"]

    def write(path, n_lines):
        lines = (" ".join(rng.choice(words) for _ in range(10)) for _ in range(n_lines))
        path.write_text("\n".join(lines), encoding="utf-8")

    def peak(path):
        tracemalloc.start()
        try:
            train_bpe_files([path], 300, [EOT], workers=1, chunk_bytes=20_000)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    write(tmp_path / "small.txt", 5_000)
    write(tmp_path / "large.txt", 40_000)
    assert (tmp_path / "large.txt").stat().st_size > 1_500_000
    peak(tmp_path / "small.txt")  # first calls allocate caches; measure after them
    small, large = peak(tmp_path / "small.txt"), peak(tmp_path / "large.txt")
    assert large < 1.3 * small + 100_000
    assert large < 1_500_000  # reading the file whole would take ~100 MB here
