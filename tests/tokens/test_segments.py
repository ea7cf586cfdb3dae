import numpy as np
import torch
import torch.nn.functional as F

from lmforge.tokens import segment_ids, segment_mask


def test_segment_ids_skip_empty_documents_and_restart_per_row():
    doc_starts = np.array([0, 3, 3, 5, 9])  # the second document is empty
    seg = segment_ids(doc_starts, np.array([0, 4]), 6)
    assert seg.tolist() == [[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 1, 2]]


def test_masked_packed_attention_equals_attention_per_document():
    torch.manual_seed(0)
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]])
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    mask = segment_mask(segments)
    assert mask.shape == (1, 1, 8, 8) and not mask[0, 0, 3, 2] and mask[0, 0, 4, 3]
    packed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for lo, hi in [(0, 3), (3, 5), (5, 8)]:
        alone = F.scaled_dot_product_attention(
            q[..., lo:hi, :], k[..., lo:hi, :], v[..., lo:hi, :], is_causal=True
        )
        torch.testing.assert_close(packed[..., lo:hi, :], alone)
