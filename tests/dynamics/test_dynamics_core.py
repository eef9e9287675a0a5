"""Simulator core: the four variants against float64 numpy references, invariants, errors."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import BlockConfig, LayerWeights, RunConfig, simulate, sphere_tokens
from rankcollapse.dynamics.attention import attention_weights, masked_softmax
from rankcollapse.errors import ConfigError, MaskError


def mu_np(X):
    return np.linalg.norm(X - X.mean(-2, keepdims=True), axis=(-2, -1))


MU = {"mu": lambda X: torch.linalg.vector_norm(X - X.mean(-2, keepdim=True), dim=(-2, -1))}


def causal(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


def np_softmax_masked(S, M):
    S = np.where(M, S, -np.inf)
    E = np.exp(S - S.max(-1, keepdims=True))
    return E / E.sum(-1, keepdims=True)


def reference(X, M, Ws, variant, d_qk):
    """float64 numpy implementation of spec.md §2 and the skip variants."""
    out = [X]
    for W_Q, W_K, W_V in Ws:
        A = np_softmax_masked(X @ W_Q @ (X @ W_K).swapaxes(-1, -2) / math.sqrt(d_qk), M)
        Y = A @ X @ W_V
        if variant == "sphere":
            Y = Y / np.linalg.norm(Y, axis=-1, keepdims=True)
        elif variant == "layernorm":
            Yc = Y - Y.mean(-1, keepdims=True)
            Y = Yc / np.sqrt((Yc**2).mean(-1, keepdims=True) + 1e-5)
        elif variant == "skip":
            Y = X + Y
        elif variant == "post_ln":
            Z = X + Y
            Zc = Z - Z.mean(-1, keepdims=True)
            Y = Zc / np.sqrt((Zc**2).mean(-1, keepdims=True) + 1e-5)
        X = Y
        out.append(X)
    return out


@pytest.mark.parametrize("variant", ["pure", "sphere", "layernorm", "skip", "post_ln"])
def test_variants_match_numpy_reference(variant):
    rng = np.random.default_rng(0)
    B, N, d, T, d_qk = 3, 7, 5, 4, 2.0
    X0 = rng.normal(size=(B, N, d))
    M = np.tril(np.ones((N, N), bool))
    Ws = [tuple(rng.normal(size=(d, d)) / math.sqrt(d) for _ in range(3)) for _ in range(T)]
    weights = [LayerWeights(*(torch.tensor(w) for w in ws)) for ws in Ws]
    res = simulate(torch.tensor(X0), mask=torch.tensor(M), d_qk=d_qk, weights=weights, metrics=MU, block=variant,
                   run=RunConfig(depth=T, dtype=torch.float64, record_states=True))
    ref = reference(X0, M, Ws, variant, d_qk)
    for t in range(T + 1):
        np.testing.assert_allclose(res.states[t].numpy(), ref[t], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(res.metrics["mu"].numpy(), np.stack([mu_np(x) for x in ref]), rtol=1e-10)
    assert res.metrics["mu"].shape == (T + 1, B)


def test_masked_entries_zero_rows_sum_to_one():
    X = torch.randn(2, 9, 4, dtype=torch.float64)
    M = causal(9)
    M[5, 0] = False
    A = attention_weights(X, M, torch.randn(4, 4).double(), torch.randn(4, 4).double(), d_qk=4.0)
    assert bool((A[:, ~M] == 0).all())
    assert bool((A[:, M] > 0).all())
    torch.testing.assert_close(A.sum(-1), torch.ones(2, 9, dtype=A.dtype))
    res = simulate(X, mask=M, metrics=MU, block=BlockConfig(n_heads=2), run=RunConfig(depth=3, record_attention=True, record_epsilon=True))
    for t, At in enumerate(res.attention):
        assert At.shape == (2, 2, 9, 9)
        assert bool((At[..., ~M] == 0).all())
        torch.testing.assert_close(At.sum(-1), torch.ones(2, 2, 9, dtype=At.dtype))
        assert float(res.epsilon_measured[t]) == pytest.approx(float(At[..., M].min()))


def test_sphere_rows_unit_norm_and_seed_reproducible():
    X = sphere_tokens(2, 12, 6, seed=1)
    kw = dict(mask=causal(12), block="sphere", metrics=MU)
    a, b, c = (simulate(X, run=RunConfig(depth=6, seed=s, record_states=True), **kw) for s in (3, 3, 4))
    for S in a.states[1:]:
        torch.testing.assert_close(S.norm(dim=-1), torch.ones(2, 12, dtype=S.dtype))
    assert torch.equal(a.metrics["mu"], b.metrics["mu"])
    assert not torch.equal(a.metrics["mu"], c.metrics["mu"])


def test_registry_metrics_streamed():
    X = torch.randn(2, 10, 8, dtype=torch.float64)
    res = simulate(X, mask=causal(10), metrics=("mu", "mu_relative"), run=RunConfig(depth=3, record_states=True))
    for t, S in enumerate(res.states):
        np.testing.assert_allclose(res.metrics["mu"][t].numpy(), mu_np(S.numpy()), rtol=1e-5)
        rel = mu_np(S.numpy()) / np.linalg.norm(S.numpy(), axis=(-2, -1))
        np.testing.assert_allclose(res.metrics["mu_relative"][t].numpy(), rel, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_norm_metrics_are_the_registrys_bit_for_bit(dtype):
    """The layer loop reads μ and the row-norm metrics off X itself (no power-of-two
    copy); a power of two only moves exponents, so at every scale of the tokens (down to
    1e-30, where squares underflow, and up to 1e11) they are the registry's values."""
    from rankcollapse.metrics import compute_metrics

    names = ("mu", "mu_relative", "token_radius", "max_token_share", "norm_spread")
    for scale in (1e-30, 1e-12, 1.0, 7.0, 1e11):
        X = torch.randn(3, 40, 8, generator=torch.Generator().manual_seed(1), dtype=dtype) * scale
        for variant in ("pure", "sphere"):
            res = simulate(X, mask="causal", metrics=names, block=variant, run=RunConfig(depth=3, record_states=True, seed=2))
            for t, S in enumerate(res.states):
                ref = compute_metrics(S, names)
                for name in names:
                    assert torch.equal(ref[name].to(torch.float64), res.metrics[name][t]), (scale, variant, t, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cosine_metrics_read_off_x_are_the_registrys_bit_for_bit(dtype):
    """The cosine averages are read off X's unit rows (no power-of-two copy): unit rows
    do not depend on a power-of-two scale, so at every scale they are the registry's
    values; with a zero token the loop takes the registry's path (and its warning)."""
    from rankcollapse.metrics import ZeroRowWarning, compute_metrics

    names = ("mu", "mu_relative", "avg_cos", "avg_abs_cos", "cos_to_mean")
    for scale in (1e-30, 1e-12, 1.0, 7.0, 1e11):
        X = torch.randn(3, 40, 8, generator=torch.Generator().manual_seed(1), dtype=dtype) * scale
        res = simulate(X, mask="causal", metrics=names, run=RunConfig(depth=3, record_states=True, seed=2))
        for t, S in enumerate(res.states):
            ref = compute_metrics(S, names)
            for name in names:
                assert torch.equal(ref[name].to(torch.float64), res.metrics[name][t]), (scale, t, name)
    X = torch.randn(2, 12, 4, generator=torch.Generator().manual_seed(3), dtype=dtype)
    X[1, 5] = 0.0  # uniform attention keeps no zero row after a layer: only the input has one
    with pytest.warns(ZeroRowWarning):
        res = simulate(X, mask="causal", metrics=names, run=RunConfig(depth=1, seed=2))
    with pytest.warns(ZeroRowWarning):
        ref = compute_metrics(X, names)
    for name in names:
        assert torch.equal(ref[name].to(torch.float64), res.metrics[name][0]), name


def test_recorded_cosines_reuse_the_token_buffer():
    """μ's centred tokens and then the unit rows go into the layer loop's one kept
    ``(B, N, d)`` buffer: no copy of X per layer."""
    from rankcollapse.dynamics.runner import _metric_fn, _peak

    X = torch.randn(4, 16, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    scratch: dict = {}
    _, measure, _ = _metric_fn(("mu", "avg_abs_cos"), scratch)
    with torch.no_grad():
        out = measure(X, None, _peak(X))
    torch.testing.assert_close(scratch["tokens"].view(X.shape), X / X.norm(dim=-1, keepdim=True))
    U = X / X.norm(dim=-1, keepdim=True)
    C = (U @ U.mT).abs()
    torch.testing.assert_close(out["avg_abs_cos"], (C.sum((1, 2)) - C.diagonal(dim1=1, dim2=2).sum(-1)) / (16 * 15))


def test_multihead_matches_torch_multihead_attention():
    torch.manual_seed(0)
    N, d, H = 6, 8, 2
    X = torch.randn(1, N, d, dtype=torch.float64)
    M = causal(N)
    mha = torch.nn.MultiheadAttention(d, H, bias=False, batch_first=True, dtype=torch.float64)
    Wq, Wk, Wv = mha.in_proj_weight.detach().chunk(3)
    lw = LayerWeights(Wq.T, Wk.T, Wv.T, W_O=mha.out_proj.weight.detach().T, n_heads=H)
    res = simulate(X, mask=M, weights=[lw], d_qk=d // H, metrics=MU, run=RunConfig(depth=1, record_states=True))
    expected = mha(X, X, X, attn_mask=~M, need_weights=False)[0]
    torch.testing.assert_close(res.states[1], expected.detach())


def test_uniform_attention_averages_over_mask():
    N, d = 5, 3
    X = torch.randn(1, N, d, dtype=torch.float64)
    M = causal(N)
    cfg = BlockConfig(attention="uniform")
    res = simulate(X, mask=M, value="identity", metrics=MU, block=cfg, run=RunConfig(depth=1, record_states=True))
    expected = (M.double() / M.sum(1, keepdim=True)) @ X[0]
    torch.testing.assert_close(res.states[1][0], expected)

    for kw in ({"d_qk": 4.0}, {"query_key": "identity"}):  # no queries or keys: refused, not ignored
        with pytest.raises(ConfigError, match="ignored by uniform attention") as err:
            simulate(X, mask=M, block=cfg, run=RunConfig(depth=1), **kw)
        assert err.value.argument == next(iter(kw))


def test_pre_ln_mlp_and_final_norm():
    N, d = 4, 6
    X = torch.randn(1, N, d, dtype=torch.float64)
    cfg = BlockConfig(norm="rmsnorm", placement="pre_ln", alpha=1.0, mlp=True, mlp_ratio=2, final_norm=True)
    res = simulate(X, mask=causal(N), value="orthogonal", metrics=MU, block=cfg, run=RunConfig(depth=1, record_states=True))
    from rankcollapse.dynamics.weights import random_layers

    lw = random_layers(d, 1, value="orthogonal", mlp_ratio=2)[0]
    rms = lambda Z: Z / torch.sqrt((Z**2).mean(-1, keepdim=True) + 1e-5)
    Xn = rms(X[0])
    A = masked_softmax(Xn @ lw.W_Q @ (Xn @ lw.W_K).T, causal(N))
    Y = X[0] + A @ Xn @ lw.W_V
    Y = Y + torch.nn.functional.gelu(rms(Y) @ lw.W_1) @ lw.W_2
    torch.testing.assert_close(res.states[1][0], Y)
    assert float(res.final_metrics["mu"][0]) == pytest.approx(float(MU["mu"](rms(Y))))


def test_qsc_orthogonal_value_collapses_geometrically_documents_do_not():
    X = torch.randn(8, 32, 16, dtype=torch.float64)
    res = simulate(X, mask=causal(32), value="orthogonal", metrics=MU, d_qk=16.0, run=RunConfig(depth=40))
    mu = res.metrics["mu"].mean(1)
    rates = (mu[1:] / mu[:-1]).numpy()
    assert (rates < 1).all()                      # monotone
    assert float(mu[-1] / mu[0]) < 1e-3           # geometric, not polynomial
    slope = np.polyfit(np.arange(20, 41), np.log(mu[20:].numpy()), 1)[0]
    assert slope < -0.1
    docs = torch.block_diag(*[torch.ones(8, 8, dtype=torch.bool).tril()] * 4)
    res_docs = simulate(X, mask=docs, value="orthogonal", metrics=MU, d_qk=16.0, run=RunConfig(depth=40))
    mu_docs = res_docs.metrics["mu"].mean(1)
    assert float(mu_docs[-1] / mu_docs[0]) > 0.1
    assert float(mu_docs[-1] / mu_docs[-11]) > 0.95  # settled at a non-zero value


def test_huge_logits_never_nan():
    M = causal(6)
    S = torch.tensor([[1e38, 3e38, -1e38, 0, 0, 0]]).repeat(6, 1) * 10  # overflows to +-inf
    A = masked_softmax(S, M)
    assert bool(torch.isfinite(A).all())
    torch.testing.assert_close(A.sum(-1), torch.ones(6))
    X = torch.randn(2, 6, 4) * 1e15
    res = simulate(X, mask=M, d_qk=1e-6, metrics=MU, block="sphere", run=RunConfig(depth=3))
    assert bool(torch.isfinite(res.metrics["mu"]).all())


def test_masked_softmax_keeps_nan_and_inf_at_masked_keys_out():
    """A NaN or +-inf score at a masked key changes nothing in its row (masked entries are 0,
    the allowed ones the softmax of the allowed scores); a NaN at an allowed key makes its row
    NaN; a mask allowing every key gives the plain softmax; a row without a key is refused."""
    nan, inf = float("nan"), float("inf")
    S = torch.tensor([[0.0, nan, 1.0], [inf, 2.0, -inf], [-inf, 2.0, 1.0], [nan, 0.0, 0.0]], dtype=torch.float64)
    M = torch.tensor([[1, 0, 1], [0, 1, 1], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    A = masked_softmax(S, M)
    e = math.exp(1.0)
    torch.testing.assert_close(A[:3], torch.tensor([[1 / (1 + e), 0.0, e / (1 + e)], [0.0, 1.0, 0.0],
                                                    [0.0, e / (1 + e), 1 / (1 + e)]], dtype=torch.float64),
                               rtol=1e-14, atol=0)
    assert bool(torch.isnan(A[3]).all())
    full = torch.ones(1, 3, dtype=torch.bool)
    torch.testing.assert_close(masked_softmax(S[2:3].clamp(-50, 50), full), torch.softmax(S[2:3].clamp(-50, 50), -1),
                               rtol=1e-14, atol=0)
    with pytest.raises(MaskError, match=r"rows \[1\] allow no key"):
        masked_softmax(torch.zeros(3, 3), torch.tensor([[1, 0, 0], [0, 0, 0], [0, 0, 1]], dtype=torch.bool))


def test_masked_softmax_keeps_a_masks_float_forms_only_while_it_is_unchanged(monkeypatch):
    """A small mask's 0/1 and log forms are kept for the next call: the same bits as computing
    them each call; a mask changed in place, or another mask at the same address, is read
    afresh; the entry goes with its mask; inference-mode masks (no version counter) work."""
    import gc

    from rankcollapse.dynamics import attention

    S = torch.randn(4, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    M = causal(6)
    first = masked_softmax(S, M)
    assert (id(M), torch.float64) in attention._MASK_FORMS
    monkeypatch.setattr(attention, "MASK_FORMS_MAX", 0)
    fresh = masked_softmax(S, M)
    monkeypatch.undo()
    assert torch.equal(first, fresh) and torch.equal(masked_softmax(S, M), fresh)
    M[5, :5] = False  # in place: row 5 attends to itself only
    A = masked_softmax(S, M)
    assert float(A[0, 5, 5]) == 1.0 and float(A[0, 4, :5].sum()) > 0
    M.fill_(True)  # every key allowed: the plain softmax path
    torch.testing.assert_close(masked_softmax(S, M), torch.softmax(S, -1), rtol=1e-15, atol=0)
    key = (id(M), torch.float64)
    del M
    gc.collect()
    assert key not in attention._MASK_FORMS
    with torch.inference_mode():
        Mi = causal(6)
    torch.testing.assert_close(masked_softmax(S, Mi), fresh, rtol=0, atol=0)


def test_zero_rows_under_sphere_warn_and_stay_zero():
    X = torch.randn(1, 4, 3, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="zero rows"):
        res = simulate(X, mask=causal(4), value=torch.zeros(3, 3), metrics=MU, block="sphere",
                       run=RunConfig(depth=2, record_states=True))
    assert bool((res.states[2] == 0).all())
    assert res.zero_rows == [4, 4]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d_qk=0.0), "d_qk"),
        (dict(d_qk=-1.0), "d_qk"),
        (dict(value=torch.eye(5)), r"W_V of layer 0 has shape \(5, 5\), expected \(4, 4\)"),
        (dict(block=dict(n_heads=3)), "n_heads=3 does not divide d_model=4"),
        (dict(block="nope"), "unknown variant"),
        (dict(run=dict(depth=0)), "depth"),
        (dict(value="gaussian:sd=1"), "takes"),
        (dict(value="orthogonal", run=dict(dtype=torch.float16)), "dtype"),
        (dict(block=dict(n_heads=0)), "n_heads"),
    ],
)
def test_bad_options_fail_before_work(kwargs, match):
    calls = []
    metrics = {"mu": lambda X: calls.append(1) or MU["mu"](X)}
    args = dict(mask=causal(6), metrics=metrics) | kwargs
    with pytest.raises(ConfigError, match=match):
        if isinstance(args.get("block"), dict):
            args["block"] = BlockConfig(**args["block"])
        args["run"] = RunConfig(**{"depth": 2, **args.get("run", {})})
        simulate(torch.randn(2, 6, 4), **args)
    assert calls == []


def test_bad_shapes_and_masks():
    with pytest.raises(ConfigError, match=r"\(N, d\) or \(B, N, d\)"):
        simulate(torch.randn(6), mask=causal(6), metrics=MU, run=RunConfig(depth=1))
    with pytest.raises(MaskError, match=r"shape \(5, 5\) for N=5"):
        simulate(torch.randn(5, 3), mask=causal(6), metrics=MU, run=RunConfig(depth=1))
    M = causal(5)
    M[2] = False
    with pytest.raises(MaskError, match=r"rows \[2\]"):
        simulate(torch.randn(5, 3), mask=M, metrics=MU, run=RunConfig(depth=1))
    with pytest.raises(ConfigError, match="placement 'none'"):
        BlockConfig(alpha=1.0)


def test_float32_matches_float64():
    X = torch.randn(2, 16, 8, dtype=torch.float64)
    a = simulate(X, mask=causal(16), metrics=MU, block="post_ln", run=RunConfig(depth=5, dtype=torch.float32))
    b = simulate(X, mask=causal(16), metrics=MU, block="post_ln", run=RunConfig(depth=5, dtype=torch.float64))
    torch.testing.assert_close(a.metrics["mu"], b.metrics["mu"], rtol=1e-4, atol=1e-5)
