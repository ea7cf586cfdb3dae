"""Declared charsets mean what they mean to a browser: the WHATWG label table and its decoders."""

import pytest

from lmforge.data import web_encodings
from lmforge.data.html import charset_from_content_type, decode_html
from lmforge.data.stats import StepStats
from lmforge.data.warc import warc_documents

# Bytes 0x93 0x94 0x96 0x80 0x85 0x99 in windows-1252; C1 controls if decoded as ISO-8859-1.
BODY = "<p>“quoted” – dash, 5 € … ™ café</p>"
WINDOWS_1252_LABELS = ("iso-8859-1", "ISO-8859-1", "latin1", "us-ascii", "ascii", "ansi_x3.4-1968")


def page(meta_label: str | None) -> bytes:
    head = f'<meta charset="{meta_label}">' if meta_label else ""
    return f"<html><head>{head}</head><body>{BODY}</body></html>".encode("cp1252")


@pytest.mark.parametrize("label", WINDOWS_1252_LABELS)
def test_latin1_and_ascii_labels_in_meta_decode_as_windows_1252(label):
    text, encoding = decode_html(page(label))
    assert BODY in text and encoding == "cp1252"
    assert not any("\x80" <= c <= "\x9f" for c in text)


@pytest.mark.parametrize("label", WINDOWS_1252_LABELS)
def test_latin1_and_ascii_labels_in_the_http_header_decode_as_windows_1252(label):
    declared = charset_from_content_type(f"text/html; charset={label}")
    assert declared == label
    text, encoding = decode_html(page(None), declared)
    assert BODY in text and encoding == "cp1252"


def test_warc_response_with_a_latin1_header_decodes_as_windows_1252(tmp_path):
    body = page(None)
    http = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=ISO-8859-1\r\n\r\n" + body
    record = (
        b"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: http://example.com/\r\n"
        b"WARC-Record-ID: <urn:uuid:1>\r\nContent-Type: application/http; msgtype=response\r\n"
        b"Content-Length: " + str(len(http)).encode() + b"\r\n\r\n" + http + b"\r\n\r\n"
    )
    (tmp_path / "a.warc").write_bytes(record)
    docs = list(warc_documents(tmp_path / "a.warc", StepStats("read")))
    assert len(docs) == 1 and BODY in docs[0].text and docs[0].meta["encoding"] == "cp1252"


def test_the_five_bytes_cp1252_leaves_undefined_are_c1_controls_as_in_browsers():
    raw = page("latin1").replace(b"dash", bytes([0x81, 0x8D, 0x8F, 0x90, 0x9D]))
    text, encoding = decode_html(raw)
    assert encoding == "cp1252" and "\x81\x8d\x8f\x90\x9d" in text and "€" in text
    assert web_encodings.decode(bytes(range(256)), "windows-1252")[0x80:0x82] == "€\x81"


def test_unknown_and_replacement_labels_fall_back_to_detection():
    for label in ("no-such-charset", "iso-2022-kr", "hz-gb-2312"):
        text, encoding = decode_html(page(label))
        assert BODY in text, label  # detection (uchardet) finds cp1252 on its own
        assert encoding != "iso2022_kr"


def test_utf8_labels_work_and_a_wrong_one_is_redetected():
    utf8 = f'<html><head><meta charset="utf8"></head><body>{BODY}</body></html>'.encode()
    assert decode_html(utf8) == (utf8.decode(), "utf-8")
    assert decode_html(utf8, declared="unicode-1-1-utf-8")[1] == "utf-8"
    # Declared UTF-8, written in windows-1252: the UTF-8 label is not trusted over the bytes.
    text, encoding = decode_html(page("utf-8"), declared="UTF-8")
    assert BODY in text and encoding == "cp1252"


def test_other_legacy_labels_use_the_standard_encoding():
    ru = "<p>Съешь же ещё этих мягких французских булок</p>"
    text, encoding = decode_html(ru.encode("cp1251"), declared="x-cp1251")
    assert text == ru and encoding == "cp1251"
    zh = "<p>简体中文的网页</p>"  # gb2312 is a label of GBK, decoded by the gb18030 decoder
    assert decode_html(zh.encode("gbk"), declared="gb2312") == (zh, "gb18030")
    ja = "<p>吾輩は猫である①</p>"  # ① exists in cp932 (Windows-31J), not in strict Shift_JIS
    assert decode_html(ja.encode("cp932"), declared="shift_jis") == (ja, "cp932")


def test_meta_utf16_means_utf8_and_x_user_defined_means_windows_1252():
    assert web_encodings.lookup("utf-16") == "UTF-16LE"
    for label in ("utf-16", "utf-16be", "x-user-defined"):
        text, encoding = decode_html(page(label))
        assert BODY in text and encoding == "cp1252", label
    # In the HTTP header x-user-defined is honoured: 0x80-0xFF become U+F780-U+F7FF.
    text, encoding = decode_html(page(None), declared="x-user-defined")
    assert encoding == "x-user-defined" and "\uf793quoted\uf794" in text


def test_label_table_covers_the_standard():
    assert len(web_encodings._TABLE) == 40
    assert len(web_encodings.LABELS) == 228
    assert web_encodings.lookup("  Latin1\t") == "windows-1252"
    assert web_encodings.lookup("latın1") is None  # only ASCII case-folding matches
    assert web_encodings.lookup("utf-32") is None
    for name in web_encodings._TABLE:
        codec = web_encodings.codec_name(name)
        if name == "replacement":
            assert codec is None
            continue
        assert isinstance(web_encodings.decode(b"plain text", name), str), name
    with pytest.raises(KeyError, match="lookup"):
        web_encodings.codec_name("latin1")


def test_patched_single_byte_tables_match_the_standard_index():
    assert web_encodings.decode(b"\xca", "windows-1255") == "\u05ba"
    assert web_encodings.decode(b"\xae\xbe", "KOI8-U") == "ўЎ"
    assert web_encodings.decode(b"\x98", "windows-1251") == "\x98"
    with pytest.raises(UnicodeDecodeError):
        web_encodings.decode(b"\xff", "windows-1255")  # undefined in the standard too
