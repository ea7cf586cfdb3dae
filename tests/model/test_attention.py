import math

import torch
import torch.nn.functional as F

from lmforge.model import Attention, ModelConfig, RotaryEmbedding, Transformer, apply_rope
from lmforge.model.attention import causal_attention


def manual_attention(attn: Attention, rope: RotaryEmbedding, x: torch.Tensor) -> torch.Tensor:
    b, t, _ = x.shape
    h, hkv, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = (x @ attn.q_proj.weight.T).view(b, t, h, d).transpose(1, 2)
    k = (x @ attn.k_proj.weight.T).view(b, t, hkv, d).transpose(1, 2)
    v = (x @ attn.v_proj.weight.T).view(b, t, hkv, d).transpose(1, 2)
    cos, sin = rope(0, t)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k = k.repeat_interleave(h // hkv, dim=1)
    v = v.repeat_interleave(h // hkv, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    future = torch.ones(t, t, dtype=torch.bool).triu(diagonal=1)
    y = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
    return y.transpose(1, 2).reshape(b, t, h * d) @ attn.o_proj.weight.T


def test_attention_matches_manual_softmax():
    attn, rope = Attention(32, n_heads=4, n_kv_heads=4), RotaryEmbedding(8, 16)
    x = torch.randn(2, 10, 32)
    torch.testing.assert_close(attn(x, *rope(0, 10)), manual_attention(attn, rope, x))


def test_gqa_matches_manual_softmax():
    attn, rope = Attention(32, n_heads=4, n_kv_heads=2), RotaryEmbedding(8, 16)
    x = torch.randn(2, 10, 32)
    torch.testing.assert_close(attn(x, *rope(0, 10)), manual_attention(attn, rope, x))


def test_gqa_equals_mha_with_repeated_kv_heads():
    gqa, mha = Attention(32, 4, 2), Attention(32, 4, 4)
    rope = RotaryEmbedding(8, 16)

    def repeat_heads(w: torch.Tensor) -> torch.Tensor:  # (2·8, 32) → (4·8, 32), heads 0,0,1,1
        return w.view(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)

    with torch.no_grad():
        mha.q_proj.weight.copy_(gqa.q_proj.weight)
        mha.o_proj.weight.copy_(gqa.o_proj.weight)
        mha.k_proj.weight.copy_(repeat_heads(gqa.k_proj.weight))
        mha.v_proj.weight.copy_(repeat_heads(gqa.v_proj.weight))
    x = torch.randn(3, 7, 32)
    torch.testing.assert_close(gqa(x, *rope(0, 7)), mha(x, *rope(0, 7)))


def test_changing_a_future_token_never_changes_earlier_logits():
    model = Transformer(ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4))
    ids = torch.randint(0, 50, (1, 12))
    changed = ids.clone()
    changed[0, 8] = (ids[0, 8] + 1) % 50
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_one_bf16_query_matches_fp32_sdpa_with_gqa_and_per_row_positions():
    """bf16 decode on a CPU takes the two-matmul path; it must agree with SDPA in fp32."""
    torch.manual_seed(0)
    q = torch.randn(3, 8, 1, 16)
    k, v = torch.randn(3, 2, 12, 16), torch.randn(3, 2, 12, 16)
    start = torch.tensor([11, 4, 0])  # each row's position: keys past it are masked out
    want = torch.cat(
        [
            F.scaled_dot_product_attention(
                q[i : i + 1], k[i : i + 1, :, : p + 1], v[i : i + 1, :, : p + 1], enable_gqa=True
            )
            for i, p in enumerate(start.tolist())
        ]
    )
    for positions in (start, 11):  # per row, or one position for all (every key visible)
        bf16 = [t.to(torch.bfloat16) for t in (q, k, v)]
        got = causal_attention(*bf16, positions).float()
        ref = (
            want if positions is start else F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        )
        torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)
