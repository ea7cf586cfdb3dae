"""Token shards on disk and the batches drawn from them.

Names import their module on first use: the shard format needs numpy only, batches need torch.
"""

from lmforge.lazy import lazy_exports

_EXPORTS = {
    "WindowSampler": "lmforge.tokens.batch",
    "get_batch": "lmforge.tokens.batch",
    "DataSource": "lmforge.tokens.loader",
    "TokenLoader": "lmforge.tokens.loader",
    "segment_ids": "lmforge.tokens.segments",
    "segment_mask": "lmforge.tokens.segments",
    "ShardMeta": "lmforge.tokens.shards",
    "load_doc_starts": "lmforge.tokens.shards",
    "load_tokens": "lmforge.tokens.shards",
    "read_meta": "lmforge.tokens.shards",
    "token_dtype": "lmforge.tokens.shards",
    "write_meta": "lmforge.tokens.shards",
    "write_shard": "lmforge.tokens.shards",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
