"""Fused projections: same attention as the plain three-projection form."""

import torch

from rankcollapse.dynamics import simulate
from rankcollapse.dynamics.attention import dense_attention, project_qkv
from rankcollapse.dynamics.weights import LayerWeights, random_layers
from rankcollapse.masks import parse_mask


def plain_attention(X, lw, mask, scale):
    """float64 reference: X W_Q (X W_K)^T, masked softmax, times X W_V."""
    S = (X @ lw.W_Q) @ (X @ lw.W_K).mT * scale
    A = torch.softmax(S.masked_fill(~mask, float("-inf")), dim=-1)
    return A @ X @ lw.W_V


def test_one_head_uses_the_score_fusion_and_matches_the_plain_form():
    lw = random_layers(6, 1, seed=3)[0].to(torch.float64, "cpu")
    assert lw.W_MV is not None and lw.W_MV.shape == (6, 12) and lw.W_QKV is None
    X = torch.randn(2, 9, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    Q, K, V = project_qkv(X, lw)
    assert K.data_ptr() == X.data_ptr()  # the keys are X itself
    M = parse_mask("causal", 9).to_dense()
    out, A = dense_attention(Q, K, V, M, scale=0.5, need_weights=True)
    torch.testing.assert_close(out.squeeze(1), plain_attention(X, lw, M, 0.5), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(A.sum(-1), torch.ones(2, 1, 9, dtype=torch.float64))


def test_heads_or_narrow_keys_keep_the_three_projections():
    heads = random_layers(8, 1, n_heads=2)[0].to(torch.float32, "cpu")
    assert heads.W_MV is None and heads.W_QKV.shape == (8, 24)
    W = torch.eye(8, dtype=torch.float64)
    narrow = LayerWeights(W[:, :4], W[:, :4], W).to(torch.float64, "cpu")  # d_k = 4 < d = 8
    assert narrow.W_MV is None and narrow.W_QKV is None


def test_float32_fused_run_tracks_the_float64_run():
    X0 = torch.randn(4, 32, 16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    a = simulate(X0.float(), mask="causal", depth=12, metrics=("mu",), seed=1)
    b = simulate(X0, mask="causal", depth=12, metrics=("mu",), seed=1)
    torch.testing.assert_close(a.metrics["mu"], b.metrics["mu"], rtol=1e-4, atol=1e-6)
