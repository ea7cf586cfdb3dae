"""PII masking: e-mail addresses, phone numbers, IP addresses and card numbers become placeholders.

Each type is a regular expression for candidates plus, where the shape alone is too loose, a
validation: IPv6 through `ipaddress`, card numbers through the Luhn checksum and the issuers'
prefixes. Phone numbers need separators or a leading `+` so that bare digit runs in code (ids,
timestamps) are left alone. Replacements look like `|||EMAIL_ADDRESS|||`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

PLACEHOLDERS = {
    "email": "EMAIL_ADDRESS",
    "credit_card": "CREDIT_CARD",
    "ipv4": "IP_ADDRESS",
    "ipv6": "IP_ADDRESS",
    "phone": "PHONE_NUMBER",
}
ALL_TYPES = tuple(PLACEHOLDERS)  # also the order of matching: cards before phones

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
PATTERNS = {
    "email": re.compile(
        r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}\b"
    ),
    "credit_card": re.compile(r"(?<![\d.-])\d(?:[ -]?\d){12,18}(?![\d-]|\.\d)"),
    "ipv4": re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\w]|\.\d)"),
    "ipv6": re.compile(
        r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|\d{1,3}(?:\.\d{1,3}){3})?"
        r"(?![\w:.])"
    ),
    "phone": re.compile(
        r"(?<![\w+.-])(?:"
        r"\+\d{1,3}[ .-]?\(?\d{1,4}\)?(?:[ .-]?\d{2,4}){2,4}"  # international, leading +
        r"|(?:1[ .-])?\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}"  # (555) 123-4567
        r"|(?:1[ .-])?\d{3}([.-])\d{3}\1\d{4}"  # 555-123-4567, 555.123.4567
        r")(?![\w.-]|\.\d)"
    ),
}

# Cheap necessary conditions, searched first: most documents hold no candidate of a type, and a
# pattern that starts with a literal is scanned far faster than the full expressions above.
PREFILTERS = {
    "email": [re.compile(r"@[\w-]+\.")],
    "credit_card": [re.compile(r"\d{4}[ -]?\d{4}")],
    "ipv4": [re.compile(r"\.\d{1,3}\.\d{1,3}\.")],
    "ipv6": [re.compile(r":[0-9A-Fa-f]{0,4}:")],
    "phone": [re.compile(p) for p in (r"\+\d", r"\(\d{3}\)", r"-\d{3}-\d{4}", r"\.\d{3}\.\d{4}")],
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
        or (3528 <= four <= 3589 and n >= 16)  # JCB
        or ((two in (36, 38, 39) or 300 <= int(digits[:3]) <= 305) and n == 14)  # Diners
    )


def _valid_card(text: str) -> bool:
    digits = re.sub(r"[ -]", "", text)
    separators = set(re.findall(r"[ -]", text))
    return len(separators) <= 1 and _card_issuer(digits) and luhn_valid(digits)


def _valid_ipv6(text: str) -> bool:
    if sum(bool(group) for group in re.split(r"[:.]", text)) < 3:
        return False  # `a::b` in C++ or `x[::2]` in Python are not addresses
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _valid_phone(text: str) -> bool:
    digits = sum(c.isdigit() for c in text)
    return 10 <= digits <= 15 if text.startswith("+") else digits in (10, 11)


VALIDATORS: dict[str, Callable[[str], bool]] = {
    "credit_card": _valid_card,
    "ipv6": _valid_ipv6,
    "phone": _valid_phone,
}


def mask_pii(text: str, types: tuple[str, ...] | list[str] = ALL_TYPES) -> tuple[str, dict]:
    """(masked text, {type: replacements}) for the PII types asked for."""
    counts: dict[str, int] = {}
    for kind in ALL_TYPES:
        if kind not in types or not any(p.search(text) for p in PREFILTERS[kind]):
            continue
        placeholder = f"|||{PLACEHOLDERS[kind]}|||"
        valid = VALIDATORS.get(kind)

        def replace(match: re.Match, kind=kind, valid=valid, placeholder=placeholder) -> str:
            if valid is not None and not valid(match.group(0)):
                return match.group(0)
            counts[kind] = counts.get(kind, 0) + 1
            return placeholder

        text = PATTERNS[kind].sub(replace, text)
    return text, counts
