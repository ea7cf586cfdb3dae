"""HTML to text: decoding page bytes with the right encoding, then extracting paragraphs.

Decoding trusts, in order: a byte-order mark, valid UTF-8 (a strong signal on its own), the
charset the server or the page declares (if the bytes decode with it), then `uchardet`'s guess
through resiliparse. Extraction is resiliparse's `extract_plain_text`, which keeps block
structure: paragraphs and headings become blank-line-separated blocks, list items keep bullets.
"""

from __future__ import annotations

import codecs
import re

BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9._:-]+)""", re.I)
_HEADER_CHARSET = re.compile(r"charset\s*=\s*[\"']?([A-Za-z0-9._:-]+)", re.I)


def charset_from_content_type(content_type: str | None) -> str | None:
    """`text/html; charset=ISO-8859-1` -> `ISO-8859-1`."""
    match = _HEADER_CHARSET.search(content_type or "")
    return match.group(1) if match else None


def decode_html(raw: bytes, declared: str | None = None) -> tuple[str, str]:
    """(text, encoding used) for the bytes of a page; `declared` is the HTTP header's charset."""
    for bom, name in BOMS:
        if raw.startswith(bom):
            return raw.decode(name, errors="replace"), name
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    meta = _META_CHARSET.search(raw[:4096])
    for label in (declared, meta.group(1).decode("ascii") if meta else None):
        if label and _known(label) and codecs.lookup(label).name != "utf-8":
            try:
                return raw.decode(label), codecs.lookup(label).name
            except UnicodeDecodeError:
                continue
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    guess = detect_encoding(raw)
    return bytes_to_str(raw, guess, errors="replace"), guess


def html_to_text(html: str, main_content: bool = False) -> str:
    """Plain text of a page with its paragraph structure; `main_content` drops boilerplate."""
    from resiliparse.extract.html2text import extract_plain_text

    text = extract_plain_text(
        html,
        preserve_formatting=True,
        main_content=main_content,
        alt_texts=False,
        comments=False,
    )
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _known(label: str) -> bool:
    try:
        codecs.lookup(label)
    except LookupError:
        return False
    return True
