"""PII masking: e-mail addresses, phone numbers, IP addresses and card numbers become placeholders.

Each type is a regular expression for candidates plus, where the shape alone is too loose, a
validation: IPv6 through `ipaddress`, card numbers through the Luhn checksum and the issuers'
prefixes, phone numbers by their digit count. A candidate that fails is retried without its
trailing groups (`4111 1111 1111 1111 12/25` is a card and an expiry date), and a few words
just before a candidate rule it out (`version 4.2.1.0`, `ISBN 9992158107`). Replacements look
like `|||EMAIL_ADDRESS|||`; `find_pii` gives the spans instead.

Two profiles: in `code`, phone numbers need separators or a leading `+`, so that bare digit runs
(ids, timestamps, constants) are left alone; in `prose`, a bare North American number
(`2831823829`, `283 182 3829`) is a phone number too. `auto` picks by `looks_like_code`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

from lmforge.data.code_detect import looks_like_code

PLACEHOLDERS = {
    "email": "EMAIL_ADDRESS",
    "credit_card": "CREDIT_CARD",
    "ipv6": "IP_ADDRESS",
    "ipv4": "IP_ADDRESS",
    "phone": "PHONE_NUMBER",
}
# Also the order of matching: cards before phones, IPv6 (which may end in an IPv4 address,
# `::ffff:192.0.2.128`) before IPv4.
ALL_TYPES = tuple(PLACEHOLDERS)
PROFILES = ("auto", "prose", "code")

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_LABEL = r"[^\W_][\w-]*"  # a domain label: Unicode letters and digits, hyphens inside
_PHONE = (
    r"\+\d{1,3}[ .-]?\(?\d{1,4}\)?(?:[ .-]?\d{2,4}){2,4}"  # international, leading +
    r"|(?:1[ .-])?\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}"  # (555) 123-4567
    r"|(?:1[ .-])?\d{3}([.-])\d{3}\1\d{4}"  # 555-123-4567, 555.123.4567
)
_PHONE_PROSE = (
    r"|(?:1 )?[2-9]\d\d \d{3} \d{4}(?! \d)"  # 283 182 3829
    r"|1?[2-9]\d{9}"  # 2831823829
)
_PHONE_START, _PHONE_END = r"(?<![\w+.$€£¥-])(?:", r")(?!\w|[.,-]\d)"

PATTERNS = {
    "email": re.compile(
        rf"(?<![^\W_]|[.%+-])[^\W_][\w.%+'-]*@{_LABEL}(?:\.{_LABEL})*\.[^\W\d_]{{2,24}}"
        r"(?![^\W_]|-|\.[^\W_])"
    ),
    "credit_card": re.compile(r"(?<![\w.-])\d(?:[ -]?\d){12,18}(?![\w-]|\.\d)"),
    "ipv4": re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\w|\.\d)"),
    "ipv6": re.compile(
        r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|\d{1,3}(?:\.\d{1,3}){3})?"
        r"(?!\w|:[\w:]|\.\w)"
    ),
    "phone": re.compile(_PHONE_START + _PHONE + _PHONE_END),  # the code profile
}
PROSE_PATTERNS = {"phone": re.compile(_PHONE_START + _PHONE + _PHONE_PROSE + _PHONE_END)}

# Cheap necessary conditions, searched first: most documents hold no candidate of a type, and a
# pattern that starts with a literal is scanned far faster than the full expressions above.
PREFILTERS = {
    "email": [re.compile(r"@[\w-]+\.")],
    "credit_card": [re.compile(r"\d{4}[ -]?\d{4}")],
    "ipv4": [re.compile(r"\.\d{1,3}\.\d{1,3}\.")],
    "ipv6": [re.compile(r":[0-9A-Fa-f]{0,4}:")],
    "phone": [re.compile(p) for p in (r"\+\d", r"\(\d{3}\)", r"-\d{3}-\d{4}", r"\.\d{3}\.\d{4}")],
}
PROSE_PREFILTERS = {"phone": re.compile(r"\d{3} ?\d{3} ?\d{4}")}  # what only prose adds

# Words just before a candidate that say it is something else: `version 4.2.1.0`, `ISBN ...`.
_NOT_AFTER = {
    "ipv4": re.compile(r"(?i)(?:version|release|build|firmware|\bver\.?|\bv)\W{0,3}$"),
    "phone": re.compile(r"(?i)isbn(?:-?1[03])?:?\s*$"),
}


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_issuer(digits: str) -> bool:
    n = len(digits)
    two, four = int(digits[:2]), int(digits[:4])
    return (
        (digits[0] == "4" and n in (13, 16, 19))  # Visa
        or ((51 <= two <= 55 or 2221 <= four <= 2720) and n == 16)  # Mastercard
        or (two in (34, 37) and n == 15)  # American Express
        or ((digits.startswith(("6011", "65")) or 644 <= int(digits[:3]) <= 649) and n >= 16)
        or (two == 62 and n >= 16)  # UnionPay
        or (3528 <= four <= 3589 and n >= 16)  # JCB
        or ((two in (36, 38, 39) or 300 <= int(digits[:3]) <= 305) and n == 14)  # Diners
    )


def _valid_card(text: str) -> bool:
    groups = re.split(r"[ -]", text)
    digits = "".join(groups)
    separators = set(re.findall(r"[ -]", text))
    grouped = len(groups) == 1 or all(3 <= len(g) <= 6 for g in groups)  # 4-4-4-4, 4-6-5
    return len(separators) <= 1 and grouped and _card_issuer(digits) and luhn_valid(digits)


def _valid_ipv6(text: str) -> bool:
    groups = [g for g in re.split(r"[:.]", text) if g]
    # `a::b` in C++ or `x[::2]` in Python are not addresses; `fe80::1` is.
    if len(groups) < 3 and not (len(groups) == 2 and "::" in text[1:-1] and len(groups[0]) == 4):
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _valid_phone(text: str) -> bool:
    digits = sum(c.isdigit() for c in text)
    if text.startswith("+1") and not text[2:3].isdigit():
        return digits == 11  # North America: +1 and ten digits
    return 10 <= digits <= 15 if text.startswith("+") else digits in (10, 11)


def _valid_email(text: str) -> bool:
    return not re.search(r"@\d+x\.", text)  # icon@2x.png is an image


VALIDATORS: dict[str, Callable[[str], bool]] = {
    "email": _valid_email,
    "credit_card": _valid_card,
    "ipv6": _valid_ipv6,
    "phone": _valid_phone,
}
_CODE_EMAIL = re.compile(r"@(?:self|this|cls)\.")  # `x@self.weight` in code is a product


def _valid_code_email(text: str) -> bool:
    return _valid_email(text) and not _CODE_EMAIL.search(text)


def _candidate_ends(kind: str, candidate: str) -> list[int]:
    """Lengths of the candidate to validate, longest first: whole, then without trailing groups."""
    if kind in ("credit_card", "phone"):
        cuts = [m.start() for m in re.finditer(r"[ .-]", candidate) if m.start() > 0]
        return [len(candidate), *reversed(cuts)]
    if kind == "ipv6" and candidate.endswith(":") and not candidate.endswith("::"):
        return [len(candidate), len(candidate) - 1]  # `fe80::1:` ends a clause
    return [len(candidate)]


def _spans(kind: str, text: str, pattern: re.Pattern, valid: Callable | None) -> list[tuple]:
    found = []
    for match in pattern.finditer(text):
        start, candidate = match.start(), match.group(0)
        before = _NOT_AFTER.get(kind)
        if before is not None and before.search(text, max(0, start - 16), start):
            continue
        for end in _candidate_ends(kind, candidate):
            if valid is None or valid(candidate[:end]):
                found.append((kind, start, start + end))
                break
    return found


def find_pii(
    text: str, types: tuple[str, ...] | list[str] = ALL_TYPES, profile: str = "auto"
) -> list[tuple[str, int, int]]:
    """(type, start, end) of every PII span, in order; `profile` is auto, prose or code."""
    if profile not in PROFILES:
        raise ValueError(f"profile {profile!r} is unknown: use auto, prose or code")
    resolved: list[bool] = []  # looks_like_code is a pass over the text: run it only if it matters

    def is_code() -> bool:
        if not resolved:
            resolved.append(profile == "code" or (profile == "auto" and looks_like_code(text)))
        return resolved[0]

    work, spans = text, []
    for kind in ALL_TYPES:
        if kind not in types:
            continue
        prose_only = PROSE_PREFILTERS.get(kind) if profile != "code" else None
        prose = prose_only is not None and bool(prose_only.search(work)) and not is_code()
        if not prose and not any(p.search(work) for p in PREFILTERS[kind]):
            continue
        valid = VALIDATORS.get(kind)
        if kind == "email" and _CODE_EMAIL.search(work) and is_code():
            valid = _valid_code_email
        found = _spans(kind, work, PROSE_PATTERNS[kind] if prose else PATTERNS[kind], valid)
        for _, start, end in found:  # later types see a masked span as a non-word character
            work = work[:start] + "\0" * (end - start) + work[end:]
        spans += found
    return sorted(spans, key=lambda span: span[1])


def mask_pii(
    text: str, types: tuple[str, ...] | list[str] = ALL_TYPES, profile: str = "auto"
) -> tuple[str, dict]:
    """(masked text, {type: replacements}) for the PII types asked for."""
    counts: dict[str, int] = {}
    pieces, last = [], 0
    for kind, start, end in find_pii(text, types, profile):
        pieces += [text[last:start], f"|||{PLACEHOLDERS[kind]}|||"]
        counts[kind] = counts.get(kind, 0) + 1
        last = end
    return "".join(pieces) + text[last:], counts
