"""tokenizer.json: the Hugging Face `tokenizers` library loads it and gives our ids."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer

from lmforge.errors import LmforgeError
from lmforge.tokenizer import GPT4_PATTERN, Tokenizer, train_bpe

EOT = "<|endoftext|>"
SPECIALS = [EOT, "<|pad|>", "<|im_start|>"]


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def saved(request, stdlib_texts, tmp_path_factory):
    """A tokenizer trained on real source, saved; and the library's view of its tokenizer.json."""
    tok = train_bpe(stdlib_texts, 1200, SPECIALS, request.param)
    folder = tmp_path_factory.mktemp(f"hf-{request.param}")
    tok.save(folder)
    return tok, HFTokenizer.from_file(str(folder / "tokenizer.json")), folder


def hf_ids(hf, text):
    return hf.encode(text, add_special_tokens=False).ids


def test_library_matches_on_real_text(saved, stdlib_texts):
    tok, hf, _ = saved
    for text in stdlib_texts:
        ids = tok.encode_ordinary(text)
        assert hf_ids(hf, text) == ids
        assert hf.decode(ids) == text
    assert hf.get_vocab_size() == tok.vocab_size


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_library_matches_on_any_text(saved, text):
    tok, hf, _ = saved
    # The library always matches its added tokens, so a text that holds one (hypothesis draws
    # the test module's own string constants too) splits there, as `allowed_special` does.
    assert hf_ids(hf, text) == tok.encode(text, allowed_special="all")


@settings(max_examples=100, deadline=None)
@given(
    text=st.lists(st.sampled_from([*SPECIALS, "<|", "pad", "|>", " x", "\n", "日"])).map("".join)
)
def test_library_splits_special_tokens_as_allowed(saved, text):
    tok, hf, _ = saved
    assert hf_ids(hf, text) == tok.encode(text, allowed_special="all")


def test_round_trip_through_tokenizer_json(saved, tmp_path):
    tok, _, folder = saved
    only = tmp_path / "only"
    only.mkdir()
    (only / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    for source in (only, only / "tokenizer.json"):
        loaded = Tokenizer.load(source)
        assert loaded.fingerprint() == tok.fingerprint()
        assert loaded.merges == tok.merges


@pytest.fixture(scope="module")
def gpt2_saved(gpt2_folder, tmp_path_factory):
    tok = Tokenizer.load(gpt2_folder)
    folder = tmp_path_factory.mktemp("gpt2-saved")
    tok.save(folder)
    return tok, folder


def test_gpt2_tokenizer_json_matches_tiktoken(gpt2_saved, gpt2_tiktoken, stdlib_texts):
    hf = HFTokenizer.from_file(str(gpt2_saved[1] / "tokenizer.json"))
    for text in [*stdlib_texts[:2], f"a{EOT}b <|endoftext| x"]:
        assert hf_ids(hf, text) == gpt2_tiktoken.encode(text, allowed_special="all")


def test_gpt2_style_byte_level_pre_tokenizer_reads(gpt2_saved, tmp_path):
    # GPT-2's own tokenizer.json: ByteLevel with its built-in regex, no Split.
    tok, folder = gpt2_saved
    obj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    obj["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    (tmp_path / "gpt2.json").write_text(json.dumps(obj), encoding="utf-8")
    loaded = Tokenizer.load(tmp_path / "gpt2.json")
    assert loaded.mergeable_ranks == tok.mergeable_ranks
    assert loaded.special_tokens == tok.special_tokens
    assert loaded.pattern == tok.pattern


def test_bad_tokenizer_json_raises(saved, tmp_path):
    folder = saved[2]
    base = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    cases = [
        ({**base, "model": {**base["model"], "type": "WordPiece"}}, "BPE only"),
        ({**base, "normalizer": {"type": "NFC"}}, "normalizer"),
        ({**base, "pre_tokenizer": {"type": "Whitespace"}}, "byte-level"),
        ({**base, "model": {**base["model"], "merges": ["Ġ zz"]}}, r"merges entry 1"),
        ({**base, "added_tokens": [{"id": 5, "content": ""}]}, "empty added token"),
        ([1, 2], "no 'model'"),
    ]
    for obj, message in cases:
        (tmp_path / "t.json").write_text(json.dumps(obj), encoding="utf-8")
        with pytest.raises(LmforgeError, match=message):
            Tokenizer.load(tmp_path / "t.json")


def test_gpt4_pattern_survives(saved):
    tok, _, folder = saved
    obj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert obj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == tok.pattern
    assert Tokenizer.load(folder / "tokenizer.json").pattern in (tok.pattern, GPT4_PATTERN)
