"""Documents from WARC and WET files (Common Crawl's formats) through `warcio`.

WET `conversion` records are already text. WARC `response`/`resource` records with an HTML body
become HTML documents (decoded with `html.decode_html`, to be extracted by the `extract` step);
other records (requests, metadata, images) are passed over. A corrupt record is counted and
skipped: reading resumes at the next record header found in the raw file (a gzip member start
for .gz files, a `WARC/1.` line otherwise), so the good records after it are not lost.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lmforge.data.documents import Document
from lmforge.data.html import charset_from_content_type, decode_html
from lmforge.data.pipeline.stats import StepStats

HTML_TYPES = ("text/html", "application/xhtml")
SCAN_BLOCK = 1 << 20


def warc_documents(path: Path, stats: StepStats) -> Iterator[Document]:
    """Text and HTML documents of one WARC/WET file, in file order."""
    from warcio.archiveiterator import ArchiveIterator

    magic = b"\x1f\x8b\x08" if path.name.endswith(".gz") else b"\nWARC/1."
    with open(path, "rb") as f:
        start: int | None = 0
        resumed = False
        while start is not None:
            f.seek(start)
            records = ArchiveIterator(f)
            last = start
            read_any = False
            try:
                for record in records:
                    body = record.content_stream().read()
                    last = records.get_record_offset()
                    read_any = True
                    doc = _document(path, record, body, last, stats)
                    if doc is not None:
                        yield doc
                return
            except Exception as e:  # warcio raises a dozen types for damaged bytes
                if read_any or not resumed:
                    stats.remove("corrupt_warc_record", f"{path}@{last}", repr(e)[:200])
            start = _find(f, last + 1, magic)
            if start is not None and magic.startswith(b"\n"):
                start += 1
            resumed = True


def _document(path: Path, record, body: bytes, offset: int, stats: StepStats) -> Document | None:
    headers = record.rec_headers
    url = headers.get_header("WARC-Target-URI") or ""
    doc_id = headers.get_header("WARC-Record-ID") or f"{path}@{offset}"
    meta = {"url": url, "date": headers.get_header("WARC-Date") or ""}
    if record.rec_type == "conversion":
        return Document(doc_id, body.decode("utf-8", errors="replace"), {**meta, "format": "text"})
    if record.rec_type not in ("response", "resource"):
        return None
    http = record.http_headers
    if http is not None and not http.get_statuscode().startswith("2"):
        stats.count("warc_non_2xx_skipped")
        return None
    content_type = (http.get_header("Content-Type") if http else None) or (
        headers.get_header("Content-Type") or ""
    )
    if not content_type.lower().startswith(HTML_TYPES):
        stats.count("warc_non_html_skipped")
        return None
    html, encoding = decode_html(body, charset_from_content_type(content_type))
    return Document(doc_id, html, {**meta, "format": "html", "encoding": encoding})


def _find(f, pos: int, magic: bytes) -> int | None:
    """Offset of the first `magic` at or after `pos`, scanning the raw file."""
    f.seek(pos)
    carry = b""
    base = pos
    while block := f.read(SCAN_BLOCK):
        data = carry + block
        at = data.find(magic)
        if at >= 0:
            return base + at
        keep = len(magic) - 1
        carry = data[-keep:]
        base += len(data) - len(carry)
    return None
