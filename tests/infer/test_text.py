import pytest

from lmforge.infer.text_assembler import TextAssembler


def feed(assembler: TextAssembler, pieces: list[bytes]) -> list[str]:
    return [assembler.push(p) for p in pieces]


def test_a_character_split_across_tokens_comes_out_whole():
    text = TextAssembler()
    euro = "€".encode()  # three bytes
    assert feed(text, [b"a", euro[:1], euro[1:2], euro[2:] + b"b"]) == ["a", "", "", "€b"]
    assert text.flush() == "" and text.text == "a€b"


def test_an_unfinished_character_is_replaced_at_the_end():
    text = TextAssembler()
    assert feed(text, [b"x", "é".encode()[:1]]) == ["x", ""]
    assert text.flush() == "\ufffd"


def test_a_stop_string_across_tokens_is_cut_and_held_back_until_settled():
    text = TextAssembler(stop=("END",))
    assert feed(text, [b"ab", b"cE", b"N", b"D", b"more"]) == ["ab", "c", "", "", ""]
    assert text.stopped and text.text == "abc"


def test_a_false_start_is_released_when_it_stops_matching():
    text = TextAssembler(stop=("END",))
    assert feed(text, [b"xE", b"Nd", b"!"]) == ["x", "ENd", "!"]
    assert not text.stopped
    assert feed(TextAssembler(stop=("END",)), [b"EN"]) == [""]


def test_held_text_is_released_at_the_end_and_the_earliest_stop_wins():
    text = TextAssembler(stop=("XYZ", "Y"))
    assert text.push(b"abX") == "ab"
    assert text.flush() == "X"
    both = TextAssembler(stop=("cd", "b"))
    assert both.push(b"abcd") == "a" and both.stopped


@pytest.mark.parametrize("stop", ["é", "aé"])
def test_stop_strings_match_characters_not_bytes(stop):
    text = TextAssembler(stop=(stop,))
    data = "xaé".encode()
    out = feed(text, [data[i : i + 1] for i in range(len(data))])
    assert "".join(out) == "xa"[: 2 - len(stop) + 1] and text.stopped
