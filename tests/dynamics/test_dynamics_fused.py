"""Fused projections: same attention as the plain three-projection form."""

import torch

from rankcollapse.dynamics import RunConfig, simulate
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
    a = simulate(X0.float(), mask="causal", metrics=("mu",), run=RunConfig(depth=12, seed=1))
    b = simulate(X0, mask="causal", metrics=("mu",), run=RunConfig(depth=12, seed=1))
    torch.testing.assert_close(a.metrics["mu"], b.metrics["mu"], rtol=1e-4, atol=1e-6)


def test_projection_scratch_gives_the_same_bits_and_is_reused():
    """With a scratch dict the fused projections are written into one kept tensor:
    the same values as a fresh ``X W``, the same storage on the next layer, and a fresh
    tensor again when autograd needs one."""
    scratch: dict = {}
    for n_heads in (1, 2):
        lws = [lw.to(torch.float32, "cpu") for lw in random_layers(8, 2, n_heads=n_heads, seed=1)]
        X = torch.randn(3, 10, 8, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            ptrs = []
            for lw in lws:
                got, ref = project_qkv(X, lw, scratch=scratch), project_qkv(X, lw)
                assert all(torch.equal(g, r) for g, r in zip(got, ref))
                ptrs.append(got[0].untyped_storage().data_ptr())
            assert ptrs[0] == ptrs[1]
    Xg = torch.randn(3, 10, 8, requires_grad=True)
    Q, _, _ = project_qkv(Xg, lws[0], scratch=scratch)
    assert Q.requires_grad and Q.untyped_storage().data_ptr() != ptrs[0]


def test_small_attention_flushes_subnormal_weights_and_equals_the_safe_path():
    """Near-hard attention on the small dense path: weights below ``finfo.tiny`` are
    dropped before ``A V`` (2-3x faster there), the output is the safe path's."""
    from rankcollapse.dynamics.attention import flush_subnormal

    for dtype, big in ((torch.float32, 95.0), (torch.float64, 730.0)):
        tiny = torch.finfo(dtype).tiny
        A = torch.tensor([tiny / 4, tiny, 0.5, 0.0], dtype=dtype)
        assert flush_subnormal(A).tolist() == [0.0, tiny, 0.5, 0.0]
        n = 40
        Q = torch.zeros(2, 1, n, 4, dtype=dtype)
        K = torch.randn(2, 1, n, 4, generator=torch.Generator().manual_seed(0), dtype=dtype)
        Q[..., 0], K[..., 0] = 1.0, 0.0
        K[..., 0, 0] = big  # rows that see key 0 give every other key exp(-big): subnormal
        V = torch.randn(2, 1, n, 4, generator=torch.Generator().manual_seed(1), dtype=dtype)
        M = parse_mask("causal", n).to_dense()
        fast, _ = dense_attention(Q, K, V, M, scale=1.0)
        scratch: dict = {}
        with torch.no_grad():  # scores and weights in kept tensors: the same bits, twice
            for _ in range(2):
                assert torch.equal(dense_attention(Q, K, V, M, scale=1.0, scratch=scratch)[0], fast)
        assert set(scratch) == {"scores", "weights"}
        safe, W = dense_attention(Q, K, V, M, scale=1.0, need_weights=True)
        assert 0 < float(W[..., M].min()) < tiny  # the safe path keeps (and reports) them
        assert torch.equal(fast, safe) or torch.allclose(fast, safe, rtol=4 * torch.finfo(dtype).eps, atol=0)


def test_flush_leaves_float16_and_weights_autograd_needs():
    """float16's smallest normal (6.1e-5) times N is not negligible, and autograd keeps
    the softmax output for backward: neither is flushed, and backward through the small
    path gives the safe path's gradient."""
    from rankcollapse.dynamics.attention import flush_subnormal

    half = torch.tensor([4e-5, 0.5], dtype=torch.float16)
    assert flush_subnormal(half.clone()).tolist() == half.tolist()
    g = torch.Generator().manual_seed(0)
    Q = torch.randn(1, 1, 6, 4, generator=g, requires_grad=True)
    K, V = torch.randn(1, 1, 6, 4, generator=g), torch.randn(1, 1, 6, 4, generator=g)
    M = parse_mask("causal", 6).to_dense()
    dense_attention(Q, K, V, M, scale=0.5)[0].sum().backward()
    fast, Q.grad = Q.grad.clone(), None
    dense_attention(Q, K, V, M, scale=0.5, need_weights=True)[0].sum().backward()
    torch.testing.assert_close(fast, Q.grad)
