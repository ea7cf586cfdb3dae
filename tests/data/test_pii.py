"""PII masking: recall on written examples of every type, no false positives on code and prose,
the issue's leaks, the prose and code profiles, and precision/recall on the labelled set."""

from pathlib import Path

import pytest

from lmforge.data.documents import Document, stdlib_root
from lmforge.data.pii import ALL_TYPES, find_pii, looks_like_code, luhn_valid, mask_pii
from lmforge.data.pii_eval import case_errors, load_cases, score
from lmforge.data.pipeline.steps import Pii
from lmforge.errors import LmforgeError

POSITIVES = {
    "email": [
        "john.doe@example.com",
        "jane_smith+news@mail.co.uk",
        "support@sub.domain-name.org",
        "x99@host.io",
    ],
    "phone": [
        "(555) 123-4567",
        "555-123-4567",
        "555.987.6543",
        "1-800-555-0199",
        "+1 555 123 4567",
        "+44 20 7946 0958",
        "+49 30 1234567",
        "+33 1 23 45 67 89",
        "+81 3-1234-5678",
        "+91 98765 43210",
    ],
    "ipv4": ["192.168.1.10", "10.0.0.1", "8.8.8.8", "172.16.254.1"],
    "ipv6": [
        "2001:db8::ff00:42:8329",
        "fe80::1ff:fe23:4567:890a",
        "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
        "::ffff:c000:280",
    ],
    "credit_card": [
        "4111 1111 1111 1111",
        "5500-0000-0000-0004",
        "378282246310005",
        "3782 822463 10005",
        "6011111111111117",
        "4012888888881881",
    ],
}
PLACEHOLDER = {
    "email": "|||EMAIL_ADDRESS|||",
    "phone": "|||PHONE_NUMBER|||",
    "ipv4": "|||IP_ADDRESS|||",
    "ipv6": "|||IP_ADDRESS|||",
    "credit_card": "|||CREDIT_CARD|||",
}


@pytest.mark.parametrize("kind", list(POSITIVES))
def test_every_written_example_is_masked_with_its_typed_placeholder(kind):
    for value in POSITIVES[kind]:
        text = f"Contact: {value}, thanks."
        masked, counts = mask_pii(text)
        assert masked == f"Contact: {PLACEHOLDER[kind]}, thanks.", value
        assert counts == {kind: 1}, value


NEGATIVES = """\
Version 3.11.7 was released on 2023-12-04 at 14:30:45; see section 1.2.3.4.5 of the notes.
The total was 1,234,567 dollars, or 0.000123 per unit, and pi is 3.14159265358979.
Order number 1234567890123 shipped; the card ending 4111 1111 1111 1112 was declined.
uuid = "123e4567-e89b-12d3-a456-426614174000"; mac = "00:1a:2b:3c:4d:5e"
x = data[::2] + data[1::3]; std::vector<int> v; a::b::c(); ts = 1700000000123
@decorator
def handler(a, b):
    return a @ b, {"key": value}, "user@localhost", 0xDEADBEEF, 10**9 + 7
"""


def test_no_false_positives_on_ordinary_text_and_code():
    masked, counts = mask_pii(NEGATIVES)
    assert counts == {} and masked == NEGATIVES
    assert not luhn_valid("4111111111111112") and luhn_valid("4111111111111111")


def test_real_source_code_yields_only_the_authors_email_addresses():
    text = "".join(p.read_text() for p in sorted(stdlib_root().glob("[a-c]*.py")))
    masked, counts = mask_pii(text)
    assert set(counts) == {"email"}  # e.g. the authors' addresses in argparse.py, bz2.py
    assert "steven.bethard@gmail.com" not in masked


def test_pii_step_counts_each_type_and_types_are_selectable():
    docs = [
        Document("a", "mail me at a@b.example.org or call 555-123-4567"),
        Document("b", "nothing to see"),
        Document("c", "server 10.1.2.3 and card 4111-1111-1111-1111"),
    ]
    step = Pii()
    out = list(step(docs))
    assert out[0].text == "mail me at |||EMAIL_ADDRESS||| or call |||PHONE_NUMBER|||"
    assert out[1].text == "nothing to see"
    assert step.stats.counters == {
        "email": 1,
        "phone": 1,
        "ipv4": 1,
        "credit_card": 1,
        "documents_masked": 2,
    }
    only_email = Pii(Pii.Config(types=["email"]))
    assert [d.text for d in only_email(docs)][2] == docs[2].text


# The leaks from the issue, each with the exact masked text expected.
LEAKS = [
    ("Call 555-123-4567.", "Call |||PHONE_NUMBER|||."),
    ("(555) 123-4567.", "|||PHONE_NUMBER|||."),
    ("+44 20 7946 0958.", "|||PHONE_NUMBER|||."),
    ("Server 2001:db8::ff00:42:8329.", "Server |||IP_ADDRESS|||."),
    ("mail _john@example.com", "mail _|||EMAIL_ADDRESS|||"),
    ("ülrich@example.de", "|||EMAIL_ADDRESS|||"),
    ("Call 2831823829.", "Call |||PHONE_NUMBER|||."),
    ("Call 283 182 3829.", "Call |||PHONE_NUMBER|||."),
    ("Is it 555-123-4567?", "Is it |||PHONE_NUMBER|||?"),
    ("The gateway is 192.168.1.10.", "The gateway is |||IP_ADDRESS|||."),
    ("Card 4111 1111 1111 1111.", "Card |||CREDIT_CARD|||."),
]


@pytest.mark.parametrize("text,expected", LEAKS)
def test_the_issues_leaks_are_masked_in_prose(text, expected):
    assert mask_pii(text, profile="prose")[0] == expected
    assert mask_pii(text)[0] == expected  # auto: these read as prose


@pytest.mark.parametrize("text", ["ts = 2831823829", "widths = [283 182 3829]"])
def test_bare_digit_runs_are_phone_numbers_only_in_prose(text):
    assert mask_pii(text, profile="code") == (text, {})
    assert mask_pii(text, profile="prose")[1] == {"phone": 1}


def test_separated_phone_numbers_are_masked_in_code_too():
    masked, counts = mask_pii('PHONE = "555-123-4567."', profile="code")
    assert masked == 'PHONE = "|||PHONE_NUMBER|||."' and counts == {"phone": 1}


def test_unknown_profile_is_an_error():
    with pytest.raises(ValueError, match="profile"):
        mask_pii("x", profile="markdown")


def test_find_pii_gives_typed_spans_in_order():
    text = "ip 10.0.0.1, mail a.b@example.org, call 555-123-4567"
    spans = find_pii(text)
    assert [(kind, text[a:b]) for kind, a, b in spans] == [
        ("ipv4", "10.0.0.1"),
        ("email", "a.b@example.org"),
        ("phone", "555-123-4567"),
    ]


def test_looks_like_code_separates_source_files_from_prose():
    sources = sorted(stdlib_root().glob("[a-f]*.py"))
    assert sum(looks_like_code(p.read_text()) for p in sources) >= 0.95 * len(sources)
    prose = [
        "Dear Ann,\n\nthanks for the notes from Monday: if the shipment is late again, we will\n"
        "return the order. For the new office, call me at 2831823829; from 9 to 5, call the\n"
        "desk. The server 2001:db8::1 (see the wiki) is down.\n\nBest, Tom",
        "Call me at 2831823829 tomorrow.\nThanks, Ann",
        "Import duties, for example, apply: a = b is not code.",
    ]
    assert not any(looks_like_code(text) for text in prose)


CASES = load_cases(Path(__file__).parent / "pii_cases.jsonl")


def test_the_labelled_set_covers_every_type_context_and_trap():
    assert len(CASES) >= 200
    labelled = {kind for case in CASES for kind, _ in case["pii"]}
    assert labelled == set(ALL_TYPES)
    contexts = {case["context"] for case in CASES}
    assert {"sentence_final", "parenthesised", "quoted", "url", "code", "trap"} <= contexts
    assert sum(not case["pii"] for case in CASES) >= 50
    assert {case["profile"] for case in CASES} == {"prose", "code"}
    for case in CASES:  # every label is a substring of its text: the set is self-consistent
        assert all(kind in ALL_TYPES and value in case["text"] for kind, value in case["pii"])


@pytest.mark.parametrize("profile", [None, "auto"])
def test_precision_and_recall_per_type_on_the_labelled_set(profile):
    cases = [c if profile is None else {**c, "profile": profile} for c in CASES]
    scores = score(cases)
    for kind, s in scores.items():
        assert s.tp >= 20, kind
        assert s.precision >= 0.98 and s.recall >= 0.98, (kind, s)


def test_scorer_counts_a_span_with_wrong_bounds_as_both_errors():
    case = {"text": "Call 555-123-4567.", "profile": "prose", "pii": [["phone", "555-123-456"]]}
    tp, fp, fn = case_errors(case)
    assert not tp and fp == {("phone", "555-123-4567"): 1} and fn == {("phone", "555-123-456"): 1}


def test_pii_step_picks_the_profile_per_document():
    docs = [
        Document("prose", "call 2831823829 today", {"format": "text"}),
        Document("file", "call 2831823829 today", {"format": "code", "lang": "py"}),
        Document("record", "call 2831823829 today", {"path": "src/ids.rs"}),
        Document("looks", "x = 2831823829\ny = x + 1;\nprint(y)"),
    ]
    step = Pii()
    assert [step.profile(d) for d in docs] == ["auto", "code", "code", "auto"]
    out = [d.text for d in step(docs)]
    assert out == ["call |||PHONE_NUMBER||| today", *(d.text for d in docs[1:])]
    assert [d.text for d in Pii(Pii.Config(profile="prose"))(docs)][1].count("PHONE") == 1


def test_pii_step_rejects_an_unknown_profile():
    with pytest.raises(LmforgeError, match="pii.profile"):
        list(Pii(Pii.Config(profile="markdown"))([Document("a", "x")]))
