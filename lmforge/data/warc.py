"""Documents from WARC and WET files (Common Crawl's formats) through `warcio`.

WET `conversion` records are already text. WARC `response`/`resource` records with an HTML body
become HTML documents (decoded with `html.decode_html`, to be extracted by the `extract` step);
other records (requests, metadata, images) are passed over and counted.

A corrupt record is counted and skipped, and reading goes on with the next record. A `.gz` file
is read one gzip member at a time (Common Crawl compresses each record on its own), so a bad
member spoils only itself; after one whose end cannot be told, reading resumes at the next gzip
header in the raw bytes. An uncompressed file resumes at the next `WARC/1.` line.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from pathlib import Path

from lmforge.data.documents import Document
from lmforge.data.html import charset_from_content_type, decode_html
from lmforge.data.stats import StepStats
from lmforge.extras import import_extra

HTML_TYPES = ("text/html", "application/xhtml")
GZIP_MAGIC = b"\x1f\x8b\x08"
WARC_MAGIC = b"\nWARC/1."
BLOCK = 1 << 20


def warc_documents(path: Path, stats: StepStats) -> Iterator[Document]:
    """Text and HTML documents of one WARC/WET file, in file order."""
    if path.name.endswith(".gz"):
        yield from _gzip_documents(path, stats)
    else:
        yield from _plain_documents(path, stats)


def _records(stream, base: int, path: Path, stats: StepStats) -> Iterator[Document]:
    """Documents of the records in `stream`; an unreadable record raises."""
    archive = import_extra("warcio.archiveiterator", "reading WARC files", "data")
    records = archive.ArchiveIterator(stream)
    for record in records:
        body = record.content_stream().read()
        doc = _document(path, record, body, base + records.get_record_offset(), stats)
        if doc is not None:
            yield doc


def _gzip_documents(path: Path, stats: StepStats) -> Iterator[Document]:
    with open(path, "rb") as f:
        pos: int | None = 0
        while pos is not None:
            member, end = _member(f, pos)
            if member is None:
                stats.remove("corrupt_warc_record", f"{path}@{pos}")
                pos = _find(f, pos + 1, GZIP_MAGIC)
                continue
            try:
                docs = list(_records(io.BytesIO(member), pos, path, stats))
            except Exception as e:  # warcio raises a dozen types for damaged records
                stats.remove("corrupt_warc_record", f"{path}@{pos}", repr(e)[:200])
                docs = []
            yield from docs
            pos = end


def _member(f, pos: int) -> tuple[bytes | None, int | None]:
    """(decompressed bytes, offset after it) of the gzip member at `pos`; (None, _) if damaged;
    (b"", None) at the end of the file."""
    f.seek(pos)
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out: list[bytes] = []
    consumed = 0
    while not decoder.eof:
        data = f.read(BLOCK)
        if not data:
            return (b"", None) if consumed == 0 else (None, None)
        try:
            out.append(decoder.decompress(data))
        except zlib.error:
            return None, None
        consumed += len(data)
    return b"".join(out), pos + consumed - len(decoder.unused_data)


def _plain_documents(path: Path, stats: StepStats) -> Iterator[Document]:
    archive = import_extra("warcio.archiveiterator", "reading WARC files", "data")
    with open(path, "rb") as f:
        start: int | None = 0
        resumed = False
        while start is not None:
            f.seek(start)
            records = archive.ArchiveIterator(f)
            last, read_any = start, False
            try:
                for record in records:
                    body = record.content_stream().read()
                    last, read_any = records.get_record_offset(), True
                    doc = _document(path, record, body, last, stats)
                    if doc is not None:
                        yield doc
                return
            except Exception as e:  # warcio raises a dozen types for damaged records
                if read_any or not resumed:  # not the same damage seen again after a resync
                    stats.remove("corrupt_warc_record", f"{path}@{last}", repr(e)[:200])
            start = _find(f, last + 1, WARC_MAGIC)
            start = None if start is None else start + 1
            resumed = True


def _document(path: Path, record, body: bytes, offset: int, stats: StepStats) -> Document | None:
    headers = record.rec_headers
    url = headers.get_header("WARC-Target-URI") or ""
    doc_id = headers.get_header("WARC-Record-ID") or f"{path}@{offset}"
    meta = {"url": url, "date": headers.get_header("WARC-Date") or ""}
    if record.rec_type is None:  # warcio reads on past a mangled header; the record is lost
        stats.remove("corrupt_warc_record", doc_id)
        return None
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
    while block := f.read(BLOCK):
        data = carry + block
        at = data.find(magic)
        if at >= 0:
            return base + at
        carry = data[-(len(magic) - 1) :]
        base += len(data) - len(carry)
    return None
