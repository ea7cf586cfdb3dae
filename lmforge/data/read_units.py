"""What a reader reads: one input `Unit` (a file of a known kind, a stdlib file, a HF dataset)
and the `ReadConfig` every reader takes. Listing and sharding units is readers.py; reading each
kind is formats.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.data.documents import DOC_SEPARATOR, TXT_CHUNK_BYTES


@dataclass
class ReadConfig:
    shard_bytes: int = 16_000_000  # input files are grouped into shards of about this size
    max_doc_bytes: int = 10_000_000  # larger documents are skipped as `too_large`
    txt_chunk_bytes: int = TXT_CHUNK_BYTES  # 0: one document per .txt file
    doc_separator: str = DOC_SEPARATOR  # a .txt line that is exactly this splits documents
    text_key: str = "text"  # JSONL/Parquet/HF field holding the text
    id_key: str = "id"
    hf_split: str = "train"


@dataclass(frozen=True)
class Unit:
    """One readable input: a file of a known kind, a stdlib file, or a HF dataset."""

    kind: str
    path: str
    size: int = 0
    name: str = ""  # how document ids name it (documents.source_name); "" for the path

    @property
    def doc_id(self) -> str:
        return self.name or self.path
