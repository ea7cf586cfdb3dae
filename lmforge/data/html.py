"""HTML to text: decoding page bytes with the right encoding, then extracting paragraphs.

Decoding trusts, in order: a byte-order mark, valid UTF-8 (a strong signal on its own), the
charset the server or the page declares (if the bytes decode with it), then `uchardet`'s guess
through resiliparse. A declared label means what it means to a browser (`web_encodings`, the
WHATWG label table): `iso-8859-1`, `latin1` and `us-ascii` are windows-1252, so 0x80-0x9F are
“ ” – € rather than C1 controls. An unknown label, or one of the "replacement" encoding, is
ignored; a `<meta>` naming UTF-16 means UTF-8 and x-user-defined windows-1252, as in the HTML
standard's prescan (the page's ASCII could not be read otherwise).

Extraction is resiliparse's `extract_plain_text`, which keeps block structure: paragraphs and
headings become blank-line-separated blocks, list items keep bullets.
"""

from __future__ import annotations

import codecs
import re

from lmforge.data import web_encodings
from lmforge.extras import import_extra

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
    """(text, codec used) for the bytes of a page; `declared` is the HTTP header's charset."""
    for bom, name in BOMS:
        if raw.startswith(bom):
            return raw.decode(name, errors="replace"), name
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    meta = _META_CHARSET.search(raw[:4096])
    candidates = (
        web_encodings.lookup(declared),
        _meta_encoding(meta.group(1).decode("ascii") if meta else None),
    )
    for name in candidates:
        codec = web_encodings.codec_name(name) if name else None
        if codec is None or codec == "utf-8":  # unknown, replacement, or already failed
            continue
        try:
            return web_encodings.decode(raw, name), codec
        except UnicodeDecodeError:
            continue
    encoding = import_extra("resiliparse.parse.encoding", "decoding HTML", "data")
    guess = encoding.detect_encoding(raw)
    return encoding.bytes_to_str(raw, guess, errors="replace"), guess


def html_to_text(html: str, main_content: bool = False) -> str:
    """Plain text of a page with its paragraph structure; `main_content` drops boilerplate."""
    html2text = import_extra("resiliparse.extract.html2text", "extracting HTML", "data")
    text = html2text.extract_plain_text(
        html,
        preserve_formatting=True,
        main_content=main_content,
        alt_texts=False,
        comments=False,
    )
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _meta_encoding(label: str | None) -> str | None:
    """The encoding a `<meta charset>` label selects (HTML's prescan: UTF-16 there means UTF-8)."""
    name = web_encodings.lookup(label)
    if name in ("UTF-16LE", "UTF-16BE"):
        return "UTF-8"
    return "windows-1252" if name == "x-user-defined" else name
