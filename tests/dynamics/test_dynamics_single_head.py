"""The single-head fast path against ``simulate``, and the one zero-row rule of the
``sphere`` norm followed by every caller (simulate, phase sweep, Theorem-2 check,
AttentionSystem)."""

import pytest
import torch

from rankcollapse.dynamics import BlockConfig, RunConfig, simulate
from rankcollapse.dynamics.layers import sphere
from rankcollapse.dynamics.single_head import single_head_layer
from rankcollapse.dynamics.weights import LayerWeights
from rankcollapse.errors import ConfigError
from rankcollapse.masks import causal

CONFIGS = [BlockConfig(norm="none", placement="none"), BlockConfig(norm="sphere", placement="none"),
           BlockConfig(norm="sphere", placement="post_ln"), BlockConfig(norm="layernorm", placement="pre_ln"),
           BlockConfig(norm="rmsnorm", placement="post_ln", alpha=0.5), BlockConfig(norm="sphere", placement="pre_ln")]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.norm}-{c.placement}")
def test_per_sample_weights_match_simulate_sample_by_sample(cfg):
    g = torch.Generator().manual_seed(3)
    B, N, d, d_k = 3, 5, 4, 2
    X = torch.randn(B, N, d, generator=g, dtype=torch.float64)
    W_Q, W_K = (torch.randn(B, d, d_k, generator=g, dtype=torch.float64) for _ in range(2))
    W_V = torch.randn(B, d, d, generator=g, dtype=torch.float64) / d ** 0.5
    mask = causal(N)
    for kw, scale in (({"d_qk": 2.0}, None), ({}, 2.0 ** -0.5)):
        got, A, z = single_head_layer(X, mask.to_dense(), LayerWeights(W_Q, W_K, W_V, scale=scale), cfg, **kw)
        assert A.shape == (B, N, N) and int(z) == 0
        for b in range(B):
            lw = LayerWeights(W_Q=W_Q[b], W_K=W_K[b], W_V=W_V[b])
            ref = simulate(X[b], mask=mask, d_qk=2.0, weights=[lw], metrics=("mu",), block=cfg,
                           run=RunConfig(depth=1, dtype=torch.float64, record_states=True)).states[1]
            torch.testing.assert_close(got[b], ref.reshape(N, d), rtol=1e-12, atol=1e-12)


#: every placement, norm and qk_norm beyond the first ones; mix switches rule at layer 3
NORMALISATIONS = [BlockConfig(norm="layernorm", placement="peri"), BlockConfig(norm="rmsnorm", placement="mix", mix_layers=2),
                  BlockConfig(norm="layernorm", placement="lns"), BlockConfig(norm="sphere", placement="ngpt"),
                  BlockConfig(norm="dyt", placement="pre_ln"), BlockConfig(norm="dyt", placement="post_ln", dyt_alpha=2.0),
                  BlockConfig(norm="none", placement="none", qk_norm=True),
                  BlockConfig(norm="layernorm", placement="pre_ln", qk_norm=True, qk_norm_scale=3.0),
                  BlockConfig(norm="sphere", placement="ngpt", qk_norm=True, alpha_ngpt=0.5),
                  BlockConfig(norm="rmsnorm", placement="post_ln", qk_norm=True, attention="sink:b=1"),
                  BlockConfig(norm="rmsnorm", placement="pre_ln", headwise_rmsnorm=True),
                  BlockConfig(norm="none", placement="none", headwise_rmsnorm=True, attention="sink:b=1")]


@pytest.mark.parametrize("cfg", NORMALISATIONS,
                         ids=lambda c: f"{c.norm}-{c.placement}-qk{int(c.qk_norm)}-hw{int(c.headwise_rmsnorm)}-{c.attention}")
def test_every_normalisation_matches_simulate_layer_by_layer(cfg):
    """Four layers of the fast path (per-sample weights, the layer index passed) against
    simulate run sample by sample with that sample's weights: mix changes rule after
    layer 2, lns scales by 1/sqrt(l)."""
    g = torch.Generator().manual_seed(7)
    B, N, d, depth = 2, 5, 4, 4
    X0 = torch.randn(B, N, d, generator=g, dtype=torch.float64)
    W = [[torch.randn(B, d, d, generator=g, dtype=torch.float64) / d ** 0.5 for _ in range(3)] for _ in range(depth)]
    mask = causal(N)
    X = X0
    for t in range(depth):
        X, A, _ = single_head_layer(X, mask.to_dense(), LayerWeights(*W[t], scale=0.5), cfg, layer=t + 1)
    for b in range(B):
        weights = [LayerWeights(W_Q=Wq[b], W_K=Wk[b], W_V=Wv[b], scale=0.5) for Wq, Wk, Wv in W]
        ref = simulate(X0[b], mask=mask, weights=weights, metrics=("mu",), block=cfg,
                       run=RunConfig(depth=depth, dtype=torch.float64, record_states=True)).states[-1]
        torch.testing.assert_close(X[b], ref.reshape(N, d), rtol=1e-12, atol=1e-12)


def test_the_layer_index_matters_where_the_rule_says():
    """lns at layer 4 is not lns at layer 1 (the factor 1/sqrt(l)); pre_ln does not look at it."""
    g = torch.Generator().manual_seed(1)
    X = torch.randn(6, 4, generator=g, dtype=torch.float64)
    W = LayerWeights(*(torch.randn(4, 4, generator=g, dtype=torch.float64) for _ in range(3)))
    dense = causal(6).to_dense()
    lns = BlockConfig(norm="layernorm", placement="lns")
    first, fourth = (single_head_layer(X, dense, W, lns, layer=t)[0] for t in (1, 4))
    assert not torch.allclose(first, fourth)
    pre = BlockConfig(norm="layernorm", placement="pre_ln")
    assert torch.equal(single_head_layer(X, dense, W, pre, layer=1)[0], single_head_layer(X, dense, W, pre, layer=4)[0])


def test_fast_path_refuses_what_only_simulate_runs():
    X = torch.randn(4, 2, dtype=torch.float64)
    W = torch.eye(2, dtype=torch.float64)
    for cfg in (BlockConfig(placement="pre_ln", mlp=True), BlockConfig(n_heads=2), BlockConfig(attention="uniform")):
        with pytest.raises(ConfigError, match="use simulate"):
            single_head_layer(X, causal(4).to_dense(), LayerWeights(W, W, W), cfg)
    for extra in (dict(W_O=W), dict(b_Q=W[0]), dict(n_heads=2)):  # parts the fast path does not run
        with pytest.raises(ConfigError, match="use simulate"):
            single_head_layer(X, causal(4).to_dense(), LayerWeights(W, W, W, **extra), BlockConfig())


def _rows():
    """A zero row, a row of subnormal entries, a huge row and a plain one."""
    return torch.tensor([[0.0, 0.0, 0.0], [3e-320, -4e-320, 0.0], [3e300, 4e300, 0.0], [1.0, 2.0, 2.0]],
                        dtype=torch.float64)


@pytest.mark.parametrize("direct", [False, True])
def test_sphere_zero_row_rule(direct):
    X = _rows()
    Y, n = sphere(X, direct=direct)
    assert int(n) == 1 and bool((Y[0] == 0).all())
    expect = torch.tensor([[0.6, -0.8, 0.0], [0.6, 0.8, 0.0], [1 / 3, 2 / 3, 2 / 3]], dtype=torch.float64)
    torch.testing.assert_close(Y[1:], expect, rtol=0, atol=4e-16)  # subnormal and huge rows land on the sphere
    Y, n = sphere(X, zero_rows="nan", direct=direct)
    assert int(n) == 1 and bool(Y[0].isnan().all()) and bool(Y[1:].isfinite().all())
    with pytest.raises(ConfigError, match=r"rows \[\[0\]\] are zero before normalisation"):
        sphere(X, zero_rows="raise", direct=direct)
    with pytest.raises(ConfigError, match="zero_rows must be one of"):
        sphere(X, zero_rows="drop")


def test_sphere_direct_is_the_plain_division_on_normal_rows():
    X = torch.randn(50, 7, dtype=torch.float64)
    assert torch.equal(sphere(X, direct=True)[0], X / torch.linalg.vector_norm(X, dim=-1, keepdim=True))


def test_phase_sweep_keeps_and_reports_zero_rows_like_simulate(monkeypatch):
    import rankcollapse.phase.batched as batched
    from rankcollapse.phase.grid import DEFAULTS

    make = batched.make_input

    def with_zero_row(*args):
        X = make(*args).clone()
        X[0, 0] = 0  # pre_ln: norm(X) meets it at layer 1
        return X

    monkeypatch.setattr(batched, "make_input", with_zero_row)
    c = {**DEFAULTS, "norm": "sphere", "placement": "pre_ln", "alpha": 1.0, "depth": 3}
    with pytest.warns(RuntimeWarning, match=r"zero rows \(left at zero\) in layers \[1\]"):
        batched.run_group([c], n_samples=2)


def test_theorem2_check_raises_on_a_zero_row_naming_the_layer(monkeypatch):
    import rankcollapse.theory.sphere as thm2

    monkeypatch.setattr(thm2, "haar_orthogonal", lambda d, g, batch: torch.zeros(*batch, d, d, dtype=torch.float64))
    with pytest.raises(ConfigError, match=r"layer 0: SA-LN step undefined: rows \[\[0, 0\]"):
        thm2.check_sphere_collapse("causal", n_tokens=4, d_model=3, depth=2, n_samples=2)


def test_attention_system_follows_the_rule_without_a_tolerance():
    from rankcollapse.theory.system import causal_uniform_system

    X = sphere(torch.randn(3, 2, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64))[0]
    unit = causal_uniform_system(torch.eye(2, dtype=torch.float64), 2)
    tiny = causal_uniform_system(1e-310 * torch.eye(2, dtype=torch.float64), 2)  # rows of norm ~1e-310: defined
    torch.testing.assert_close(tiny.step(X), unit.step(X), rtol=0, atol=1e-12)
    zero = causal_uniform_system(torch.zeros(2, 2, dtype=torch.float64), 2)
    with pytest.raises(ConfigError, match="zero before normalisation"):
        zero.step(X)
    assert bool(zero.step(X, check=False).isnan().all())
