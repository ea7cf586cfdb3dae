"""Telling source code from prose: by a document's format or file name, then by its text.

`names_source_file(doc)` says whether the document's metadata or id names a source file (the
`code` format the readers give source files, or a code extension such as `.py` in its id or in a
`path`-like field of a JSONL record); `looks_like_code(text)` reads the lines themselves; and
`is_code(doc)` is either. The PII masker and the quality rules use them to choose a profile.
"""

from __future__ import annotations

import re

from lmforge.data.documents import Document

PATH_KEYS = ("path", "file", "filename", "file_path", "ext")  # JSONL fields that name a file
_PART_SUFFIX = re.compile(r"(?:#\d+|:\d+)$")  # `a.txt#3` (a .txt chunk), `a.jsonl:12` (a line)

_CODE_LINE = re.compile(
    r"[;{}]\s*$"  # C-like statement or block ends
    r"|^\s*(?:def|class|fn|func|function)\s+\w+\s*[(<:{]"
    r"|^\s*(?:import\s+[\w.{*]|from\s+[\w.]+\s+import\b|#include\b|#define\b|package\s+\w)"
    r"|^\s*(?:const|let|var|auto|int|long|static|public|private)\s+\w+.*="
    r"|^\s*(?:if|elif|for|while|with|try|except|else)\b.*:\s*$"
    r"|^\s*[\w.\[\]'\"]+\s*(?:[-+*/|&]?=|:=)\s*\S"  # assignment
    r"|[\w)\]'\"]\s*(?:==|!=|->|=>|&&|\|\|)"  # operators
    r"|\w::[A-Za-z_]\w*[(<]"  # `std::vector<`, `Foo::bar(`, but not IPv6's `db8::ff00`
    r"|^\s*return(?:\s*$|\s+\S+$|.*[()\[\]{};]$)"  # not prose wrapped before "return the"
    r"|^\s*(?:[)\]}]+[,;]?\s*$|['\"][^'\"]*['\"]\s*:\s*\S)"  # closing brackets, dict entries
)


def looks_like_code(text: str, min_fraction: float = 0.15) -> bool:
    """Whether at least `min_fraction` of the first 400 non-blank lines read as source code."""
    lines = [line for line in text[:65536].splitlines() if line.strip()][:400]
    if not lines:
        return False
    return sum(bool(_CODE_LINE.search(line)) for line in lines) >= min_fraction * len(lines)


def names_source_file(doc: Document) -> bool:
    """Whether `doc`'s format, id or a path-like meta field names a source-code file."""
    from lmforge.data.readers import CODE_SUFFIXES

    if doc.meta.get("format") == "code":
        return True
    names = [_PART_SUFFIX.sub("", doc.id)]
    names += [v for k in PATH_KEYS if isinstance(v := doc.meta.get(k), str)]
    return any("." + name.rsplit(".", 1)[-1].lower() in CODE_SUFFIXES for name in names)


def is_code(doc: Document) -> bool:
    """Source code by its file type (`names_source_file`), else by its text (`looks_like_code`)."""
    return names_source_file(doc) or looks_like_code(doc.text)
