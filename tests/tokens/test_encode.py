import numpy as np

from lmforge.tokenizer import Tokenizer
from lmforge.tokens import load_doc_starts, load_tokens, read_meta


def test_prepared_shards_hold_each_document_after_a_separator(prepared):
    tokenizer = Tokenizer.load(prepared.shard_dir / "tokenizer")
    meta = read_meta(prepared.shard_dir)
    assert meta.tokenizer_fingerprint == tokenizer.fingerprint()
    assert meta.vocab_size == tokenizer.vocab_size == 320
    train = load_tokens(prepared.shard_dir, "train")
    starts = load_doc_starts(prepared.shard_dir, "train")
    assert len(train) == meta.shards["train"]["tokens"]
    assert len(starts) == meta.shards["train"]["documents"] == prepared.stats["documents"]["train"]
    assert (np.asarray(train)[starts] == tokenizer.eot_id).all()
    assert int((np.asarray(train) == tokenizer.eot_id).sum()) == len(starts)


def test_shards_decode_back_to_the_documents(prepared):
    from lmforge.data import read_jsonl

    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    val = np.asarray(load_tokens(prepared.shard_dir, "val"))
    starts = [*list(load_doc_starts(prepared.shard_dir, "val")), len(val)]
    docs = list(read_jsonl(prepared.root / "data" / "val.jsonl"))
    assert len(docs) == len(starts) - 1 >= 1
    for doc, a, b in zip(docs, starts, starts[1:], strict=False):
        assert tokenizer.decode(val[a + 1 : b].tolist()) == doc.text


def test_parallel_encoding_matches_single_process(prepared):
    from lmforge.tokens.encode import encode_texts

    tokenizer = Tokenizer.load(prepared.tokenizer_dir)
    texts = [f"def f{i}(x):\n    return x * {i}  # é ✓\n" for i in range(50)]
    assert list(encode_texts(tokenizer, texts, workers=2)) == list(
        encode_texts(tokenizer, texts, workers=1)
    )
