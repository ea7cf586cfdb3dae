"""train.loader.document_mask: packed documents attend only to themselves, from the loader to
the CLI."""

import numpy as np
import torch

import lmforge.model.attention as attention
from lmforge.cli import main
from lmforge.model import ModelConfig, Transformer
from lmforge.tokens import WindowSampler, load_doc_starts, load_tokens
from lmforge.tokens.batch import window_starts
from lmforge.train.batches import make_batches
from lmforge.train.metrics import read_metrics

MODEL = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32)


def test_no_token_sees_another_document():
    torch.manual_seed(0)
    model = Transformer(MODEL).eval()
    segments = torch.tensor([[0] * 5 + [1] * 9 + [2] * 10, [0] * 24])
    ids = torch.randint(0, 64, (2, 24))
    changed = ids.clone()
    changed[0, 5:14] = torch.randint(0, 64, (9,))  # a different middle document
    with torch.no_grad():
        a = model(ids, segments=segments)
        b = model(changed, segments=segments)
        alone = model(ids[:1, 14:])  # the last document on its own, from position 0
    outside = torch.ones(24, dtype=torch.bool)
    outside[5:14] = False
    torch.testing.assert_close(a[0, outside], b[0, outside], rtol=0, atol=1e-6)
    assert not torch.allclose(a[0, 5:14], b[0, 5:14])
    torch.testing.assert_close(a[:1, 14:], alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a[1:], model(ids[1:]).detach(), rtol=1e-5, atol=1e-5)


def test_random_windows_carry_the_documents_of_their_tokens(prepared):
    tokens = load_tokens(prepared.shard_dir, "train")
    doc_starts = load_doc_starts(prepared.shard_dir, "train")
    plain = WindowSampler(tokens, 4, 64, seed=3)
    masked = WindowSampler(tokens, 4, 64, seed=3, doc_starts=doc_starts)
    x, y = plain.batch(5, 1)
    mx, my, segments = masked.batch(5, 1)
    assert torch.equal(x, mx) and torch.equal(y, my)  # the same windows either way
    assert segments.shape == x.shape and segments.dtype == torch.int32
    starts = window_starts(tokens, 4, 64, np.random.default_rng([3, 5, 1]))
    assert torch.equal(
        x, torch.from_numpy(np.stack([tokens[s : s + 64] for s in starts]).astype(np.int64))
    )
    boundaries = set(doc_starts.tolist())
    for start, seg in zip(starts, segments, strict=True):
        assert seg[0] == 0
        new_document = [int(start) + i in boundaries for i in range(1, 64)]
        assert (seg.diff() == 1).tolist() == new_document
        assert bool((seg.diff() <= 1).all() and (seg.diff() >= 0).all())
    sequential = make_batches("sequential", prepared.shard_dir, 4, 64, 0, segments=True)
    try:
        assert len(sequential.next(0, 0, torch.device("cpu"))) == 3
    finally:
        sequential.close()


def test_training_with_document_masking_from_the_cli(prepared, tmp_path):
    args = ["train", "--preset", "tiny", "--data", str(prepared.shard_dir), "--out",
            str(tmp_path), "--device", "cpu", "--threads", "1", "--max-steps", "4",
            "--set", "train.eval.every=0", "--set", "train.log_every=2",
            "--set", "train.batch_size=4", "--set", "train.eval.batches=1",
            "--set", "train.loader.document_mask=true"]  # fmt: skip
    assert main(args) == 0
    logs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in logs] == [2, 4]
    assert all(np.isfinite(r["loss"]) for r in logs)
    assert "document_mask = true" in (tmp_path / "config.toml").read_text()


def test_the_tiled_kernel_gives_the_masked_sdpa_result(monkeypatch):
    torch.manual_seed(0)
    model = Transformer(MODEL)
    ids = torch.randint(0, 64, (2, 24))
    segments = torch.tensor([[0] * 5 + [1] * 9 + [2] * 10, [0] * 11 + [1] * 13])
    results = []
    for min_seq in (10**9, 8):  # SDPA with the explicit mask, then FlashAttention-2
        monkeypatch.setattr(attention, "DOCUMENT_FA2_MIN_SEQ", min_seq)
        model.zero_grad()
        logits = model(ids, segments=segments)
        logits.square().mean().backward()
        results.append((logits.detach(), model.layers[0].attn.q_proj.weight.grad.clone()))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-4, atol=1e-6)
