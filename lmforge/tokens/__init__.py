"""Token shards on disk and the batches drawn from them."""

from lmforge.tokens.batch import WindowSampler, get_batch
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
    "ShardMeta",
    "WindowSampler",
    "get_batch",
    "load_doc_starts",
    "load_tokens",
    "read_meta",
    "token_dtype",
    "write_meta",
    "write_shard",
]
