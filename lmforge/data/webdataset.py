"""Reading documents from WebDataset-style tar shards with the standard library's tarfile.

A sample is the run of consecutive members sharing a key: the member path up to the first dot
of its file name (`a/b.x.txt` has key `a/b`). Its text comes from `KEY.txt`, else from the
`text` field of `KEY.json`, which may also give `id` and `meta`. Samples with neither (images,
audio) are skipped. Gzip/bz2/xz-compressed tars are read as well.
"""

from __future__ import annotations

import json
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from lmforge.data.stats import ReadStats

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def is_tar(path: Path) -> bool:
    return path.name.endswith(TAR_SUFFIXES)


def split_key(member: str) -> tuple[str, str]:
    """(key, extension) of a member path: `a/b.x.txt` -> (`a/b`, `x.txt`)."""
    folder, _, name = member.rpartition("/")
    stem, _, ext = name.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


def tar_samples(path: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) for each sample of the tar, streamed in member order."""
    key: str | None = None
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                k, ext = split_key(member.name)
                if k != key:
                    if key is not None:
                        yield key, files
                    key, files = k, {}
                handle = tar.extractfile(member)
                files[ext] = handle.read() if handle else b""
    except tarfile.TarError as e:
        raise LmforgeError(f"{path} is not a readable tar file ({e}): replace or remove it") from e
    if key is not None:
        yield key, files


def tar_documents(path: Path, stats: ReadStats | None = None) -> Iterator[tuple[str, str, dict]]:
    """(id, text, meta) of each sample with text; non-UTF-8 samples are skipped and counted."""
    if stats is not None:
        stats.files += 1
    for key, files in tar_samples(path):
        obj: dict = {}
        try:
            if "json" in files:
                obj = json.loads(files["json"].decode("utf-8"))
                if not isinstance(obj, dict):
                    raise ValueError("not a JSON object")
            text = files["txt"].decode("utf-8") if "txt" in files else obj.get("text")
        except UnicodeDecodeError:
            if stats is not None:
                if stats.skipped_not_utf8 == 0:
                    print(
                        f"warning: skipping {path}:{key}: not UTF-8 (more are counted)",
                        file=sys.stderr,
                    )
                stats.skipped_not_utf8 += 1
            continue
        except ValueError as e:
            raise LmforgeError(
                f"{path}: member {key}.json is not a JSON object ({e}): fix or remove it"
            ) from e
        if isinstance(text, str) and text:
            yield str(obj.get("id", f"{path}:{key}")), text, obj.get("meta", {})
