"""PII masking: recall on written examples of every type, no false positives on code and prose."""

import pytest

from lmforge.data.documents import Document, stdlib_root
from lmforge.data.pii import luhn_valid, mask_pii
from lmforge.data.pipeline.steps import Pii

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
