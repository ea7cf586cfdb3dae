"""The decode step's softmax kernels, in every instruction set this CPU runs.

lmforge_cpu::paged_attention, attention read straight from the engine's paged KV cache, equals
SDPA over the same keys and values gathered in order; malformed tables are refused with the row
and block they name. Where no kernel runs (the generic and neon profiles) the engine's cache
attends over a gathered copy instead. lmforge_cpu::sample_rows picks the token a full cumsum
of the softmax picks, and never a masked one."""

import pytest
import torch
import torch.nn.functional as F

from lmforge.device.capability import DECODE_ISAS, cpu_capability, narrower
from lmforge.infer.kv_cache import PagedKVCache
from lmforge.infer.sampling import draw
from lmforge.kernels import cpu_decode
from lmforge.model import ModelConfig, Transformer

HOST_ISA = cpu_capability().decode_isa
RUNNABLE = [isa for isa in DECODE_ISAS if HOST_ISA and narrower(isa, HOST_ISA) == isa]
if not RUNNABLE or cpu_decode.load() is not None:  # an ARM or compiler-less machine
    pytest.skip(f"no decode kernel runs here: {cpu_decode.load()}", allow_module_level=True)


def operands(b, h, h_kv, d, n_blocks, block_size, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    pools = [torch.randn(h_kv, n_blocks, block_size, d, generator=g) for _ in "kv"]
    new = [torch.randn(b, h_kv, d, generator=g) for _ in "kv"]
    q = torch.randn(b, h, d, generator=g)
    tables = torch.stack([torch.randperm(n_blocks, generator=g)[:width] for _ in range(b)])
    lengths = torch.randint(0, width * block_size + 1, (b,), generator=g)
    lengths[0], lengths[-1] = 0, width * block_size  # only its new key; a full table
    return q, *pools, *new, tables, lengths


def reference(q, k_pool, v_pool, k_new, v_new, tables, lengths) -> torch.Tensor:
    """SDPA over each row's cached positions, gathered through its table, then its new one."""
    block_size = k_pool.shape[2]
    out = []
    for row in range(q.shape[0]):
        positions = torch.arange(int(lengths[row]))
        blocks = tables[row, positions // block_size]
        k = torch.cat([k_pool[:, blocks, positions % block_size], k_new[row, :, None]], 1)
        v = torch.cat([v_pool[:, blocks, positions % block_size], v_new[row, :, None]], 1)
        y = F.scaled_dot_product_attention(q[row, :, None], k, v, enable_gqa=True)
        out.append(y[:, 0])
    return torch.stack(out)


@pytest.mark.parametrize("isa", RUNNABLE)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size"),
    [(4, 4, 64, 16), (8, 2, 32, 4), (4, 1, 128, 16), (2, 2, 8, 3)],
)
def test_equals_sdpa_over_the_gathered_blocks(isa, heads, kv_heads, head_dim, block_size):
    args = operands(5, heads, kv_heads, head_dim, 30, block_size, 6)
    got = cpu_decode.paged_attention(*args, isa)
    want = reference(*args)
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_large_scores_keep_a_finite_softmax() -> None:
    """Scores in the thousands: each row's maximum is subtracted before exponentiating."""
    q, *rest = operands(3, 4, 4, 64, 10, 16, 3)
    assert torch.isfinite(cpu_decode.paged_attention(q * 1e4, *rest, RUNNABLE[0])).all()
    got = cpu_decode.paged_attention(q * 100, *rest, RUNNABLE[0])
    assert (got - reference(q * 100, *rest)).abs().max() <= 1e-4


def test_malformed_tables_and_shapes_are_refused_clearly() -> None:
    q, k, v, kn, vn, tables, lengths = operands(2, 4, 2, 32, 8, 4, 3)
    isa = RUNNABLE[0]
    with pytest.raises(RuntimeError, match="row 1 has 13 cached positions, its table holds 12"):
        cpu_decode.paged_attention(q, k, v, kn, vn, tables, torch.tensor([0, 13]), isa)
    bad = tables.clone()
    bad[0, 0] = 8
    with pytest.raises(RuntimeError, match="row 0 names block 8 of 8"):
        cpu_decode.paged_attention(q, k, v, kn, vn, bad, torch.tensor([1, 0]), isa)
    with pytest.raises(RuntimeError, match="int64"):
        cpu_decode.paged_attention(q, k, v, kn, vn, tables.int(), lengths, isa)
    with pytest.raises(RuntimeError, match="head dim must be a multiple of 8"):
        narrow = [t[..., :4].contiguous() for t in (q, k, v, kn, vn)]
        cpu_decode.paged_attention(*narrow, tables, lengths, isa)


@pytest.mark.parametrize(
    ("profile", "kernel"), [("avx2", True), ("generic", False), ("neon", False)]
)
def test_the_engine_cache_attends_in_place_only_where_a_kernel_runs(monkeypatch, profile, kernel):
    monkeypatch.setenv("LMFORGE_CPU_PROFILE", profile)
    config = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, max_seq_len=32)
    model = Transformer(config).eval()
    assert (PagedKVCache(model, 4, 4).attention_isa == "avx2") is kernel
    assert PagedKVCache(model.to(torch.bfloat16), 4, 4).attention_isa is None  # fp32 pools only


@pytest.mark.parametrize("isa", RUNNABLE)
@pytest.mark.parametrize("vocab", [4096, 799, 5])
def test_sample_rows_picks_what_a_full_cumsum_of_the_softmax_picks(monkeypatch, isa, vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(300, vocab, generator=g) * 4
    logits[:, 1::3] = float("-inf")  # masked (top-k, top-p, min-p)
    u = torch.rand(300, generator=g)
    cdf = logits.softmax(-1).cumsum(-1)
    want = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    got = cpu_decode.sample_rows(logits, u, isa)
    assert got.dtype == torch.long and (got != want).sum() <= 1  # a boundary may round either way
    assert torch.isfinite(logits.gather(-1, got[:, None])).all()
    edges = cpu_decode.sample_rows(logits[:2], torch.tensor([0.0, 1 - 2**-24]), isa)
    assert edges[0] == 0 and torch.isfinite(logits[1, edges[1]])
    assert (draw(logits, u) == got).all()  # the engine's draw takes the kernel here
    monkeypatch.setenv("LMFORGE_CPU_PROFILE", "generic")  # and torch's ops where none runs
    assert (draw(logits, u) != want).sum() <= 1


def test_sample_rows_refuses_what_it_cannot_read() -> None:
    with pytest.raises(RuntimeError, match="one per row"):
        cpu_decode.sample_rows(torch.zeros(3, 8), torch.zeros(2), RUNNABLE[0])
