"""Attention operators that are not row-stochastic (sink, off-by-one, sigmoid, differential):
weights against numpy float64 written from the formulas, the layer through ``simulate``,
refusals, and the sink measurement of docs/theory.md with its closed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import BlockConfig, LayerWeights, RunConfig, simulate
from rankcollapse.dynamics.operators import AttentionOperator, operator_weights, parse_attention
from rankcollapse.errors import ConfigError
from rankcollapse.metrics import norm_spread


def _np_softmax(S, M):
    S = np.where(M, S, -np.inf)
    e = np.exp(S - S.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _qk(seed=0, B=2, H=2, N=7, d_k=4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, N, d_k, generator=g, dtype=torch.float64),
            torch.randn(B, H, N, d_k, generator=g, dtype=torch.float64))


CAUSAL = torch.tril(torch.ones(7, 7, dtype=torch.bool))


@pytest.mark.parametrize("b", [-3.0, 0.0, 2.0, 50.0])
def test_sink_is_an_extra_key_with_logit_b_and_zero_value(b):
    Q, K = _qk()
    A = operator_weights(Q, K, CAUSAL, parse_attention(f"sink:b={b}"), scale=0.5).numpy()
    S = 0.5 * (Q.numpy() @ np.swapaxes(K.numpy(), -1, -2))
    # reference 1: the formula exp(S_ij) / (exp(b) + sum_k exp(S_ik)), in float64 with the max taken out
    Sm = np.where(CAUSAL.numpy(), S, -np.inf)
    m = np.maximum(Sm.max(-1, keepdims=True), b)
    ref = np.exp(Sm - m) / (np.exp(Sm - m).sum(-1, keepdims=True) + np.exp(b - m))
    np.testing.assert_allclose(A, ref, rtol=1e-13, atol=1e-300)
    # reference 2: softmax over the keys plus one always-allowed key of logit b, that key dropped
    ext = np.concatenate([S, np.full(S.shape[:-1] + (1,), b)], -1)
    Mext = np.concatenate([CAUSAL.numpy(), np.ones((7, 1), bool)], -1)
    np.testing.assert_allclose(A, _np_softmax(ext, Mext)[..., :-1], rtol=1e-12, atol=1e-300)
    assert (A.sum(-1) < 1).all()


def test_offbyone_is_sink_at_zero():
    Q, K = _qk(1)
    assert parse_attention("offbyone") == AttentionOperator("sink", b=0.0)
    a = operator_weights(Q, K, CAUSAL, parse_attention("offbyone"), scale=1.0)
    b = operator_weights(Q, K, CAUSAL, parse_attention("sink:b=0"), scale=1.0)
    assert torch.equal(a, b)


@pytest.mark.parametrize("spec, bias", [("sigmoid", -np.log(7)), ("sigmoid:bias=1.5", 1.5)])
def test_sigmoid_attention_elementwise(spec, bias):
    Q, K = _qk(2)
    A = operator_weights(Q, K, CAUSAL, parse_attention(spec), scale=0.3).numpy()
    S = 0.3 * (Q.numpy() @ np.swapaxes(K.numpy(), -1, -2))
    ref = np.where(CAUSAL.numpy(), 1 / (1 + np.exp(-(S + bias))), 0.0)
    np.testing.assert_allclose(A, ref, rtol=1e-13)


def test_differential_attention_is_difference_of_two_half_softmaxes():
    Q, K = _qk(3, d_k=6)
    A = operator_weights(Q, K, CAUSAL, parse_attention("diff:lambda=0.4"), scale=0.7).numpy()
    q, k = Q.numpy(), K.numpy()
    S1 = 0.7 * q[..., :3] @ np.swapaxes(k[..., :3], -1, -2)
    S2 = 0.7 * q[..., 3:] @ np.swapaxes(k[..., 3:], -1, -2)
    ref = _np_softmax(S1, CAUSAL.numpy()) - 0.4 * _np_softmax(S2, CAUSAL.numpy())
    np.testing.assert_allclose(A, ref, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(A.sum(-1), 0.6, rtol=1e-12)
    with pytest.raises(ConfigError, match="odd"):
        operator_weights(*_qk(3, d_k=5), CAUSAL, parse_attention("diff:lambda=0.4"), scale=1.0)


@pytest.mark.parametrize("spec, match", [
    ("sink", "needs key 'b'"), ("sink:c=1", "takes parameters b"), ("sink:b=x", "key 'b' must be a finite number"),
    ("sink:b=inf", "finite"), ("diff", "needs key 'lambda'"), ("softmax:b=1", "no parameters"), ("relu", "unknown"),
    ("", "unknown attention ''; choose one of softmax"), (None, "attention must be a string"),
])
def test_bad_operator_specs_are_refused(spec, match):
    with pytest.raises(ConfigError, match=match):
        BlockConfig(attention=spec)


def test_block_config_stores_the_canonical_spec():
    assert BlockConfig(attention="offbyone").attention == "sink:b=0"
    assert BlockConfig(attention="sigmoid").attention == "sigmoid"
    assert BlockConfig(attention="sink:b=2.50").attention == "sink:b=2.5"


def test_one_sink_layer_through_simulate_matches_numpy():
    g = torch.Generator().manual_seed(4)
    N, d = 6, 4
    X0 = torch.randn(N, d, generator=g, dtype=torch.float64)
    W_Q, W_K, W_V = (torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(3))
    lw = LayerWeights(W_Q=W_Q, W_K=W_K, W_V=W_V)
    res = simulate(X0, mask="causal", weights=[lw], d_qk=4.0, block=BlockConfig(attention="sink:b=1"),
                   run=RunConfig(depth=1, dtype=torch.float64, record_states=True, record_attention=True))
    x = X0.numpy()
    S = (x @ W_Q.numpy()) @ (x @ W_K.numpy()).T / 2.0
    M = np.tril(np.ones((N, N), bool))
    ext = np.concatenate([S, np.ones((N, 1))], -1)
    A = _np_softmax(ext, np.concatenate([M, np.ones((N, 1), bool)], -1))[:, :-1]
    np.testing.assert_allclose(res.states[1][0].numpy(), A @ x @ W_V.numpy(), rtol=1e-12)
    deficit = 1 - A.sum(-1)
    q = res.row_mass_deficit[0, 0, 0].numpy()
    np.testing.assert_allclose(q, np.quantile(deficit, [0.05, 0.5, 0.95]), rtol=1e-12)


def test_report_of_a_sink_layer_reads_its_deficit_and_shows_the_token_norms():
    """One sink layer (b = 1) on one sample and head: the report's row-mass quantiles and
    mean token norm are numpy's, the norms are shown beside the metric asked, with a note."""
    g = torch.Generator().manual_seed(4)
    N, d = 6, 4
    X0 = torch.randn(N, d, generator=g, dtype=torch.float64)
    W_Q, W_K, W_V = (torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(3))
    res = simulate(X0, mask="causal", weights=[LayerWeights(W_Q=W_Q, W_K=W_K, W_V=W_V)], d_qk=4.0,
                   block=BlockConfig(attention="sink:b=1"), metrics=("mu_relative", "token_radius", "max_token_share"),
                   run=RunConfig(depth=1, dtype=torch.float64))
    x = X0.numpy()
    S = (x @ W_Q.numpy()) @ (x @ W_K.numpy()).T / 2.0
    ext = np.concatenate([S, np.ones((N, 1))], -1)
    A = _np_softmax(ext, np.concatenate([np.tril(np.ones((N, N), bool)), np.ones((N, 1), bool)], -1))[:, :-1]
    rep = res.report(["mu_relative"])
    assert rep["metrics"] == ["mu_relative", "token_radius", "max_token_share"]
    assert rep["notes"][0].startswith("attention sink:b=1 is not row-stochastic")
    first, second = rep["layers"]
    assert first["epsilon_measured"] is None and "row_mass_deficit_q50" not in first
    np.testing.assert_allclose([second[f"row_mass_deficit_q{q}"] for q in ("05", "50", "95")],
                               np.quantile(1 - A.sum(-1), [0.05, 0.5, 0.95]), rtol=1e-12)
    assert second["token_radius"] == pytest.approx(np.linalg.norm(A @ x @ W_V.numpy(), axis=1).mean(), rel=1e-12)
    assert second["point"] == "layer.0.output" and rep["stopped"] is None


def test_report_of_softmax_shows_the_metrics_asked_only():
    X0 = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    res = simulate(X0, mask="causal", metrics=("mu", "token_radius", "max_token_share"),
                   run=RunConfig(depth=2, dtype=torch.float64))
    rep = res.report(["mu"])
    assert rep["metrics"] == ["mu"] and rep["notes"] == [] and rep["stopped"] is None
    assert [sorted(row) for row in rep["layers"]] == [["at_floor", "epsilon_measured", "layer", "mu", "point"]] * 3
    assert rep["layers"][2]["mu"] == pytest.approx(float(res.metrics["mu"][2].mean()), rel=1e-15)
    assert res.report()["metrics"] == ["mu", "token_radius", "max_token_share"]


def test_softmax_records_no_row_mass_and_operators_refuse_windowed_kernels():
    X0 = torch.randn(2, 8, 4, dtype=torch.float64)
    assert simulate(X0, mask="causal", run=RunConfig(depth=2, dtype=torch.float64)).row_mass_deficit is None
    with pytest.raises(ConfigError, match="^backend 'blocked' cannot run attention"):
        simulate(X0, mask="causal", block=BlockConfig(attention="offbyone"), run=RunConfig(depth=2, backend="blocked"))
    res = simulate(X0, mask="causal", block=BlockConfig(attention="offbyone"), run=RunConfig(depth=2, dtype=torch.float64))
    assert res.config["backend"] == "dense" and res.config["block"]["attention"] == "sink:b=0"
    assert res.row_mass_deficit.shape == (2, 2, 1, 3)


def test_norm_spread_hand_built():
    X = torch.tensor([[3.0, 4.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    assert float(norm_spread(X)) == pytest.approx(5.0, rel=1e-15)
    assert float(norm_spread(torch.ones(4, 3))) == 1.0
    from rankcollapse.errors import MetricError

    with pytest.raises(MetricError, match="infinite"):  # a zero token: not the spread of the others
        norm_spread(torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]], dtype=torch.float64))


def _sink_run(mask, attention, seed):
    g = torch.Generator().manual_seed(seed)
    X0 = torch.randn(32, 16, generator=g, dtype=torch.float64) + 0.5
    r = simulate(X0, mask=mask, value="orthogonal", metrics=["mu_relative", "avg_abs_cos", "norm_spread"],
                 block=BlockConfig(attention=attention), run=RunConfig(depth=64, seed=seed, dtype=torch.float64))
    return {k: float(v[-1, 0]) for k, v in r.metrics.items()}


def _perron_profile(N, b):
    """Closed form of the causal sink's aligned state (docs/theory.md): once the tokens are
    parallel and their norms have shrunk, the scores vanish and A_ij = 1 / (i + 1 + e^b)
    for j <= i; the norms follow the Perron vector of that lower-triangular matrix."""
    L = np.tril(np.ones((N, N))) / (np.arange(N)[:, None] + 1 + np.exp(b))
    w, V = np.linalg.eig(L)
    v = np.abs(V[:, np.argmax(w.real)].real)
    return np.sqrt(1 - v.mean() ** 2 / (v ** 2).mean()), v.max() / v.min()


@pytest.mark.parametrize("b", [0.0, 2.0])
def test_causal_sink_aligns_without_consensus_at_the_closed_form(b):
    """Pure SA, N = 32, d = 16, 64 layers, Haar W_V, N(0, 1) + 0.5 inputs: under the causal
    mask a sink keeps mu/||X||_F at the Perron profile's value while the tokens align."""
    mu_rel, spread = _perron_profile(32, b)
    for seed in range(2):
        got = _sink_run("causal", "offbyone" if b == 0 else f"sink:b={b}", seed)
        assert got["avg_abs_cos"] > 1 - 1e-9
        assert got["mu_relative"] == pytest.approx(mu_rel, rel=1e-3)
        assert got["norm_spread"] == pytest.approx(spread, rel=0.05)


@pytest.mark.parametrize("attention", ["softmax", "sink:b=2"])
def test_complete_mask_collapses_with_or_without_a_sink(attention):
    """Negative control of the above: every row sees every key, so at consensus every row
    has the same mass and consensus persists."""
    got = _sink_run("complete", attention, 0)
    assert got["mu_relative"] < 1e-13 and got["norm_spread"] == pytest.approx(1.0, abs=1e-9)


def test_row_mass_deficit_registry_metric():
    from rankcollapse.metrics import compute_metrics, row_mass_deficit

    Q, K = _qk(5)
    A = operator_weights(Q, K, CAUSAL, parse_attention("sink:b=1"), scale=1.0)
    want = (1 - A.sum(-1)).mean(dim=(-1, -2))
    assert torch.allclose(row_mass_deficit(A), want, rtol=1e-14)
    soft = operator_weights(Q, K, CAUSAL, parse_attention("softmax"), scale=1.0)
    assert float(row_mass_deficit(soft).abs().max()) < 1e-14
    pad = torch.ones(2, 7, dtype=torch.bool)
    pad[1, 5:] = False  # sample 1: queries 5, 6 are padding
    got = row_mass_deficit(A, padding_mask=pad)
    assert float(got[1]) == pytest.approx(float((1 - A[1].sum(-1))[:, :5].mean()), rel=1e-14)
    X = torch.randn(2, 7, 4, dtype=torch.float64)
    via = compute_metrics(X, ["mu", "row_mass_deficit"], attention=A)["row_mass_deficit"]
    assert torch.allclose(via, want, rtol=1e-14)


@pytest.mark.parametrize("attention", ["diff:lambda=0.5", "sigmoid"])
def test_epsilon_measured_is_the_signed_smallest_allowed_entry(attention):
    # diff attention has negative entries: ε is the smallest entry, not the smallest |entry|
    X0 = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    res = simulate(X0, mask="causal", block=BlockConfig(attention=attention),
                   run=RunConfig(depth=2, dtype=torch.float64, record_epsilon=True, record_attention=True, seed=0))
    M = torch.tril(torch.ones(16, 16, dtype=torch.bool))
    want = torch.stack([A[..., M].min() for A in res.attention]).double()
    torch.testing.assert_close(res.epsilon_measured, want, rtol=0, atol=0)
    assert (want < 0).all() if attention.startswith("diff") else (want > 0).all()


def test_a_run_that_reaches_the_zero_matrix_keeps_the_layers_it_measured():
    from rankcollapse.dynamics import RunConfig, resolve_variant, simulate
    from rankcollapse.dynamics.runner import ZeroStop

    X0 = torch.randn(4, 16, 8, generator=torch.Generator().manual_seed(0))
    cfg = resolve_variant("pure", attention="sigmoid")
    with pytest.warns(RuntimeWarning, match="X is the zero matrix"):
        res = simulate(X0, mask="causal", block=cfg, run=RunConfig(depth=64, dtype=torch.float32, record_epsilon=True))
    assert isinstance(res.stopped, ZeroStop) and res.stopped.dtype == "float32"
    t = res.stopped.after_layer
    assert res.metrics["mu_relative"].shape == (65, 4)
    assert torch.isfinite(res.metrics["mu_relative"][:t]).all() and torch.isnan(res.metrics["mu_relative"][t:]).all()
    assert res.row_mass_deficit.shape[0] == res.epsilon_measured.shape[0] == 64
    assert torch.isnan(res.epsilon_measured[t:]).all() and res.to_dict()["stopped"]["after_layer"] == t
    full = simulate(X0, mask="causal", block=cfg, run=RunConfig(depth=64, dtype=torch.float64))
    assert full.stopped is None and torch.isfinite(full.metrics["mu_relative"]).all()
