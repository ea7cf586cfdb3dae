"""Token shards on disk and the batches drawn from them."""

from lmforge.tokens.batch import WindowSampler, get_batch
from lmforge.tokens.loader import DataSource, TokenLoader
from lmforge.tokens.segments import segment_ids, segment_mask
from lmforge.tokens.shards import (
    ShardMeta,
    load_doc_starts,
    load_tokens,
    read_meta,
    token_dtype,
    write_meta,
    write_shard,
)

__all__ = [
    "DataSource",
    "ShardMeta",
    "TokenLoader",
    "WindowSampler",
    "get_batch",
    "load_doc_starts",
    "load_tokens",
    "read_meta",
    "segment_ids",
    "segment_mask",
    "token_dtype",
    "write_meta",
    "write_shard",
]
