"""The normalisations (Peri-LN, Mix-LN, LayerNorm scaling, nGPT, Dynamic Tanh,
QK-norm): each block against a small case computed by hand from its paper's equation,
and against a plain numpy float64 reference written from the same equations, over
several layers with random weights."""

import math
import sys

import numpy as np
import pytest
import torch
from scipy.special import erf

from rankcollapse.dynamics import BlockConfig, LayerWeights, RunConfig, simulate
from rankcollapse.dynamics.layers import Attention, block_forward, qk_norm_scale
from rankcollapse.errors import ConfigError

CAUSAL3 = torch.ones(3, 3, dtype=torch.bool).tril()
X_HAND = np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
R2 = math.sqrt(2.0)


def _uniform_layer(d=2):
    """W_Q = W_K = 0 (uniform attention over each causal row), W_V = I: SA(X) is the
    causal running mean, row i = (x_1 + ... + x_i) / i."""
    z = torch.zeros(d, d, dtype=torch.float64)
    return LayerWeights(W_Q=z, W_K=z, W_V=torch.eye(d, dtype=torch.float64))


def _one_layer(cfg, X=X_HAND, layer=1, lw=None):
    attend = Attention(mask_dense=CAUSAL3)
    X = torch.tensor(X, dtype=torch.float64).unsqueeze(0)
    out, _ = block_forward(X, lw or _uniform_layer().to(torch.float64, "cpu"), cfg, attend, layer=layer)
    return out[0].numpy()


def _unit(Y):
    return Y / np.linalg.norm(Y, axis=-1, keepdims=True)


def _running_mean(Y):
    return np.cumsum(Y, axis=0) / np.arange(1, len(Y) + 1)[:, None]


# ---- hand-computed cases (N = 3, d = 2) --------------------------------------------------

def test_peri_ln_hand_case():
    """Kim et al. 2025 eq. 3, y = x + Norm(SA(Norm(x))), sphere norm: Norm(X) = rows
    [1,0], [0,1], [1,1]/sqrt2; running means [1,0], [1/2,1/2], (1+1/sqrt2)/3 [1,1];
    on the sphere [1,0], [1,1]/sqrt2, [1,1]/sqrt2; plus X."""
    expected = X_HAND + np.array([[1, 0], [1 / R2, 1 / R2], [1 / R2, 1 / R2]])
    np.testing.assert_allclose(_one_layer(BlockConfig(norm="sphere", placement="peri")), expected, rtol=1e-14)


def test_lns_hand_case_scales_the_norm_output_by_the_layer_index():
    """Sun et al. 2025 eq. 8 at layer l = 4: X + SA(Norm(X) / 2), sphere norm; running
    means of the unit rows as above, halved."""
    means = np.array([[1, 0], [0.5, 0.5], [(1 + 1 / R2) / 3] * 2])
    got = _one_layer(BlockConfig(norm="sphere", placement="lns"), layer=4)
    np.testing.assert_allclose(got, X_HAND + means / 2, rtol=1e-14)
    first = _one_layer(BlockConfig(norm="sphere", placement="lns"), layer=1)  # l = 1: pre-LN
    np.testing.assert_allclose(first, _one_layer(BlockConfig(norm="sphere", placement="pre_ln")), rtol=0, atol=0)


def test_ngpt_hand_case():
    """Loshchilov et al. 2024 eq. 10, h <- Norm(h + a (Norm(SA(h)) - h)), a = 1/2, from
    tokens on the sphere [1,0], [0,1], [1,1]/sqrt2: Norm(SA(h)) = [1,0], [1,1]/sqrt2,
    [1,1]/sqrt2, so rows 1 and 3 stay, row 2 moves to Norm([1/(2 sqrt2), 1/2 + 1/(2 sqrt2)])."""
    h = np.array([[1, 0], [0, 1], [1 / R2, 1 / R2]])
    got = _one_layer(BlockConfig(norm="sphere", placement="ngpt", alpha_ngpt=0.5), X=h)
    row2 = np.array([1 / (2 * R2), 0.5 + 1 / (2 * R2)])
    np.testing.assert_allclose(got, [h[0], row2 / np.linalg.norm(row2), h[2]], rtol=1e-14, atol=1e-16)


def test_dyt_hand_case():
    """Zhu et al. 2025 eq. 1 (gamma = 1, beta = 0) in the pre-LN place, alpha = 1/2:
    tanh(X/2) = [t1, 0], [0, t], [t, t] with t1 = tanh 1, t = tanh(1/2); running means."""
    t1, t = math.tanh(1.0), math.tanh(0.5)
    means = np.array([[t1, 0], [t1 / 2, t / 2], [(t1 + t) / 3, 2 * t / 3]])
    got = _one_layer(BlockConfig(norm="dyt", placement="pre_ln"))
    np.testing.assert_allclose(got, X_HAND + means, rtol=1e-14)
    got = _one_layer(BlockConfig(norm="dyt", placement="pre_ln", dyt_alpha=2.0))
    t1, t = math.tanh(4.0), math.tanh(2.0)
    np.testing.assert_allclose(got, X_HAND + [[t1, 0], [t1 / 2, t / 2], [(t1 + t) / 3, 2 * t / 3]], rtol=1e-14)


def test_qk_norm_hand_case():
    """Henry et al. 2020: scores g cos(x_i, x_j) (W_Q = W_K = W_V = I), no norm, no skip.
    With g = sqrt2 ln 2: cos(x1, x2) = 0, cos(x1, x3) = cos(x2, x3) = 1/sqrt2, so row 2
    weighs [1, 2^sqrt2] / (1 + 2^sqrt2), row 3 weighs [2, 2, 2^sqrt2] / (4 + 2^sqrt2)."""
    eye = torch.eye(2, dtype=torch.float64)
    lw = LayerWeights(W_Q=eye * 3.0, W_K=eye * 0.1, W_V=eye).to(torch.float64, "cpu")  # norms drop out
    g = R2 * math.log(2.0)
    got = _one_layer(BlockConfig(qk_norm=True, qk_norm_scale=g), lw=lw)
    e = 2.0 ** R2
    A = np.array([[1, 0, 0], [1 / (1 + e), e / (1 + e), 0], [2 / (4 + e), 2 / (4 + e), e / (4 + e)]])
    np.testing.assert_allclose(got, A @ X_HAND, rtol=1e-14)


def test_headwise_rmsnorm_hand_case():
    """Li et al. 2026 (arXiv 2605.06611): each head's output row over its own d_head
    entries, o / sqrt(mean(o^2) + eps). Uniform causal attention, W_V = I, two heads of
    width 2 (X_HAND and 3 X_HAND reversed): each head's running means, row by row over
    that head's two columns; no norm, no skip. One head of width 4 is RMSNorm of the whole row."""
    X = np.concatenate([X_HAND, 3 * X_HAND[::-1]], axis=1)  # (3, 4)
    M = _running_mean(X)
    eps = 1e-5

    def rms(O):
        return O / np.sqrt((O ** 2).mean(-1, keepdims=True) + eps)

    z = torch.zeros(4, 4, dtype=torch.float64)
    two = LayerWeights(W_Q=z, W_K=z, W_V=torch.eye(4, dtype=torch.float64), n_heads=2)
    got = _one_layer(BlockConfig(n_heads=2, headwise_rmsnorm=True), X=X, lw=two)
    np.testing.assert_allclose(got, np.concatenate([rms(M[:, :2]), rms(M[:, 2:])], axis=1), rtol=1e-14)
    one = _one_layer(BlockConfig(headwise_rmsnorm=True), X=X, lw=_uniform_layer(4))
    np.testing.assert_allclose(one, rms(M), rtol=1e-14)
    # the first query's output (one value) and the others' (averages) leave with one RMS
    np.testing.assert_allclose(np.sqrt((one ** 2).mean(-1)), np.sqrt(1 / (1 + eps / (M ** 2).mean(-1))), rtol=1e-14)


def test_headwise_rmsnorm_undoes_a_sink_key():
    """A sink key of value 0 (``sink:b=B``) scales each softmax row by 1 - m_i; head-wise
    RMSNorm divides that factor out, so the layer equals the softmax layer up to eps."""
    g = torch.Generator().manual_seed(3)
    X0 = torch.randn(2, 6, 4, generator=g, dtype=torch.float64)
    run = lambda attention: simulate(X0, mask="causal", metrics=("mu",),
        block=BlockConfig(  # noqa: E731
        norm="rmsnorm", placement="pre_ln", attention=attention, headwise_rmsnorm=True, eps=1e-300),
        run=RunConfig(depth=3, dtype=torch.float64, seed=0, record_states=True)).states[-1]
    torch.testing.assert_close(run("sink:b=2"), run("softmax"), rtol=1e-12, atol=1e-12)
    plain = simulate(X0, mask="causal", metrics=("mu",),
                     block=BlockConfig(norm="rmsnorm", placement="pre_ln",
                     attention="sink:b=2", eps=1e-300),
                     run=RunConfig(depth=3, dtype=torch.float64, seed=0, record_states=True)).states[-1]
    assert not torch.allclose(plain, run("softmax"), rtol=1e-3)


def test_qk_norm_default_scale_is_henry_g0():
    cfg = BlockConfig(qk_norm=True)
    assert qk_norm_scale(cfg, 3) == pytest.approx(math.log2(6.0), rel=1e-15)
    assert qk_norm_scale(cfg, 1) == 1.0
    assert qk_norm_scale(BlockConfig(qk_norm=True, qk_norm_scale=5.0), 100) == 5.0
    assert qk_norm_scale(BlockConfig(), 100) is None


def test_mix_is_post_ln_then_pre_ln():
    """Li et al. 2024: layers l <= mix_layers run the post-LN rule, later ones pre-LN."""
    mix = BlockConfig(norm="layernorm", placement="mix", mix_layers=2)
    for layer, rule in ((1, "post_ln"), (2, "post_ln"), (3, "pre_ln"), (7, "pre_ln")):
        np.testing.assert_array_equal(_one_layer(mix, layer=layer),
                                      _one_layer(BlockConfig(norm="layernorm", placement=rule), layer=layer))
    assert not np.allclose(_one_layer(mix, layer=1), _one_layer(mix, layer=3))


# ---- numpy float64 reference over several layers ---------------------------------------

def _np_norm(Y, cfg):
    if cfg.norm == "sphere":
        return _unit(Y)
    if cfg.norm == "layernorm":
        c = Y - Y.mean(-1, keepdims=True)
        return c / np.sqrt((c ** 2).mean(-1, keepdims=True) + cfg.eps)
    if cfg.norm == "rmsnorm":
        return Y / np.sqrt((Y ** 2).mean(-1, keepdims=True) + cfg.eps)
    if cfg.norm == "dyt":
        return np.tanh(cfg.dyt_alpha * Y)
    return Y


def _np_sa(X, w, mask, cfg, d_qk):
    Q, K = X @ w["W_Q"], X @ w["W_K"]
    if cfg.qk_norm:
        g = cfg.qk_norm_scale if cfg.qk_norm_scale is not None else math.log2(len(X) ** 2 - len(X))
        s = g * _unit(Q) @ _unit(K).T
    else:
        s = Q @ K.T / math.sqrt(d_qk)
    s = np.where(mask, s, -np.inf)
    A = np.exp(s - s.max(-1, keepdims=True))
    return (A / A.sum(-1, keepdims=True)) @ X @ w["W_V"]


def _np_mlp(X, w):
    H = X @ w["W_1"]
    return 0.5 * H * (1 + erf(H / math.sqrt(2))) @ w["W_2"]


def _np_layer(X, w, mask, cfg, layer, d_qk):
    """One layer, written from each paper's equation (BlockConfig docstring)."""
    norm, a = (lambda Y: _np_norm(Y, cfg)), cfg.alpha
    sa = lambda Y: _np_sa(Y, w, mask, cfg, d_qk)  # noqa: E731
    p = cfg.placement
    if p == "mix":
        p = "post_ln" if layer <= cfg.mix_layers else "pre_ln"
    if p == "post_ln":
        X = norm(a * X + sa(X))
        return norm(a * X + _np_mlp(X, w)) if cfg.mlp else X
    if p in ("pre_ln", "lns"):
        s = 1 / math.sqrt(layer) if p == "lns" else 1.0
        X = a * X + sa(norm(X) * s)
        return a * X + _np_mlp(norm(X) * s, w) if cfg.mlp else X
    if p == "peri":
        X = a * X + norm(sa(norm(X)))
        return a * X + norm(_np_mlp(norm(X), w)) if cfg.mlp else X
    if p == "ngpt":
        X = _unit(X + cfg.alpha_ngpt * (_unit(sa(X)) - X))
        return _unit(X + cfg.alpha_ngpt * (_unit(_np_mlp(X, w)) - X)) if cfg.mlp else X
    return norm(sa(X))


CONFIGS = [
    BlockConfig(norm="layernorm", placement="peri"),
    BlockConfig(norm="rmsnorm", placement="peri", mlp=True),
    BlockConfig(norm="layernorm", placement="mix", mix_layers=2),
    BlockConfig(norm="rmsnorm", placement="mix", mix_layers=1, mlp=True),
    BlockConfig(norm="layernorm", placement="lns"),
    BlockConfig(norm="sphere", placement="lns", mlp=True),
    BlockConfig(norm="sphere", placement="ngpt"),
    BlockConfig(norm="sphere", placement="ngpt", alpha_ngpt=0.3, mlp=True),
    BlockConfig(norm="dyt", placement="pre_ln", dyt_alpha=0.7),
    BlockConfig(norm="dyt", placement="post_ln"),
    BlockConfig(norm="dyt", placement="peri", mlp=True),
    BlockConfig(norm="dyt"),
    BlockConfig(qk_norm=True),
    BlockConfig(norm="layernorm", placement="pre_ln", qk_norm=True, qk_norm_scale=3.0, mlp=True),
    BlockConfig(norm="sphere", placement="ngpt", qk_norm=True),
]


@pytest.mark.parametrize("mask", ["causal", "complete"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.norm}-{c.placement}-qk{int(c.qk_norm)}-mlp{int(c.mlp)}")
def test_simulate_matches_the_numpy_reference(cfg, mask):
    N, d, depth, d_qk = 5, 4, 4, 2.0
    rng = np.random.default_rng(7)
    ws = [{k: rng.standard_normal((d, m)) / math.sqrt(d) for k, m in
           (("W_Q", d), ("W_K", d), ("W_V", d), ("W_1", 2 * d))} for _ in range(depth)]
    for w in ws:
        w["W_2"] = rng.standard_normal((2 * d, d)) / math.sqrt(2 * d)
    lws = [LayerWeights(**{k: torch.from_numpy(v) for k, v in w.items()}) for w in ws]
    X0 = rng.standard_normal((2, N, d))
    res = simulate(torch.from_numpy(X0), mask=mask, weights=lws, d_qk=d_qk, metrics=("mu",), block=cfg,
                   run=RunConfig(depth=depth, dtype=torch.float64, record_states=True))
    M = np.tril(np.ones((N, N), bool)) if mask == "causal" else np.ones((N, N), bool)
    for b in range(2):
        X = X0[b]
        for t, w in enumerate(ws):
            X = _np_layer(X, w, M, cfg, t + 1, d_qk)
            np.testing.assert_allclose(res.states[t + 1][b].numpy(), X, rtol=1e-10, atol=1e-12)


def test_final_norm_of_dyt_uses_its_alpha():
    X0 = torch.randn(1, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cfg = BlockConfig(norm="dyt", placement="pre_ln", dyt_alpha=2.0, final_norm=True)
    res = simulate(X0, mask="causal", metrics=("token_radius",), block=cfg,
                   run=RunConfig(depth=2, dtype=torch.float64, record_states=True))
    expected = np.linalg.norm(np.tanh(2.0 * res.states[-1][0].numpy()), axis=-1).mean()
    assert float(res.final_metrics["token_radius"][0]) == pytest.approx(expected, rel=1e-13)


# ---- what is refused ----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, msg", [
    (dict(placement="peri"), "places a normalisation"),
    (dict(placement="lns"), "places a normalisation"),
    (dict(placement="mix", mix_layers=2), "places a normalisation"),
    (dict(norm="layernorm", placement="ngpt"), "needs norm 'sphere'"),
    (dict(norm="sphere", placement="ngpt", alpha=0.5), "leave alpha at 1"),
    (dict(norm="layernorm", placement="mix"), "needs mix_layers"),
    (dict(norm="layernorm", placement="mix", mix_layers=-1), "mix_layers"),
    (dict(norm="layernorm", placement="pre_ln", mix_layers=2), "setting of placement 'mix'"),
    (dict(norm="layernorm", placement="pre_ln", alpha_ngpt=0.1), "setting of placement 'ngpt'"),
    (dict(norm="layernorm", dyt_alpha=1.0), "setting of norm 'dyt'"),
    (dict(norm="dyt", dyt_alpha=0.0), "dyt_alpha"),
    (dict(qk_norm_scale=2.0), "qk_norm_scale is a setting of the query-key normalisation"),
    (dict(qk_norm=True, qk_norm_scale=-1.0), "qk_norm_scale"),
    (dict(qk_norm=True, attention="uniform"), "uniform attention"),
    (dict(qk_norm=1), "qk_norm must be True or False"),
    (dict(norm="nosuch"), "norm must be one of"),
    (dict(placement="nosuch"), "placement must be one of"),
])
def test_meaningless_combinations_are_refused(kwargs, msg):
    with pytest.raises(ConfigError, match=msg):
        BlockConfig(**kwargs)


def test_cli_runs_a_new_placement_and_refuses_a_missing_setting(monkeypatch, capsys):
    from rankcollapse.cli import main

    base = ["rankcollapse", "simulate", "--n-tokens", "6", "--depth", "3", "--d-model", "4", "--n-samples", "2",
            "--norm", "layernorm", "--placement", "mix", "--format", "json"]
    monkeypatch.setattr(sys, "argv", base)
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "needs mix_layers" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setattr(sys, "argv", [*base, "--mix-layers", "1", "--qk-norm", "--metrics",
                                      "token_radius,angular_speed"])
    main()
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["block"]["placement"] == "mix" and doc["settings"]["block"]["mix_layers"] == 1
    assert doc["settings"]["block"]["qk_norm"] is True
    assert doc["layers"][0]["angular_speed"] is None and doc["layers"][1]["angular_speed"] > 0
    assert doc["layers"][2]["token_radius"] > 0


def test_phase_axes_offer_every_normalisation():
    """The phase sweep runs every norm and placement (single_head_layer applies the one
    placement rule, dynamics.layers.placement_update) and has a qk_norm axis."""
    from rankcollapse.phase.grid import expand_grid, parse_axis

    assert parse_axis("norm=dyt,rmsnorm") == ("norm", ["dyt", "rmsnorm"])
    assert parse_axis("placement=peri,mix,lns,ngpt") == ("placement", ["peri", "mix", "lns", "ngpt"])
    assert parse_axis("qk_norm=on,off") == ("qk_norm", [True, False])
    assert parse_axis("headwise_rmsnorm=on,off") == ("headwise_rmsnorm", [True, False])
    with pytest.raises(ConfigError, match="expected one of"):
        parse_axis("placement=nosuch")
    cells = expand_grid({"placement": ["mix", "lns"]}, {"norm": "layernorm", "depth": 12})
    assert [c["alpha"] for c in cells] == [1.0, 1.0]
    with pytest.raises(ConfigError, match="needs norm 'sphere'"):  # refused when the grid is made
        expand_grid({"placement": ["ngpt"]}, {"norm": "layernorm"})


def test_qk_norm_scale_is_the_qk_norm_gain():
    """The QK-norm gain g is ``qk_norm_scale`` (``qk_scale`` is phase's W_Q/W_K scale)."""
    from rankcollapse.dynamics import resolve_variant

    new = BlockConfig(qk_norm=True, qk_norm_scale=2.0)
    assert qk_norm_scale(new, 10) == 2.0
    assert resolve_variant("pure", qk_norm=True, qk_norm_scale=3.0) == BlockConfig(qk_norm=True, qk_norm_scale=3.0)
    with pytest.raises(TypeError):
        BlockConfig(qk_norm=True, qk_scale=2.0)
    assert "qk_norm_scale" in new.to_dict() and "qk_scale" not in new.to_dict()


def test_cli_qk_norm_scale(monkeypatch, capsys):
    import json

    from rankcollapse.cli import main

    base = ["rankcollapse", "simulate", "--n-tokens", "6", "--depth", "3", "--d-model", "4", "--n-samples", "2",
            "--qk-norm", "--format", "json", "--dtype", "float64"]
    monkeypatch.setattr(sys, "argv", [*base, "--qk-norm-scale", "2.5"])
    main()
    assert json.loads(capsys.readouterr().out)["settings"]["block"]["qk_norm_scale"] == 2.5
    monkeypatch.setattr(sys, "argv", [*base, "--qk-scale", "2"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2 and "--qk-scale" in capsys.readouterr().err


def test_phase_theory_makes_no_pure_sa_prediction_under_headwise_rmsnorm():
    """Head-wise RMSNorm rescales each row of A X W_V: Theorem 1 (convex mixing) and its
    envelope do not apply to a pure-SA cell with it; under the sphere norm the rescaling
    is absorbed (D(c y) = D(y)), so Theorem 2 still predicts."""
    from rankcollapse.masks import parse_mask
    from rankcollapse.masks.graph import analyze
    from rankcollapse.phase.grid import DEFAULTS
    from rankcollapse.phase.predict import envelope_applies, theory_prediction

    info = analyze(parse_mask("causal", 8))
    pure = {**DEFAULTS, "n_tokens": 8, "mask": "causal"}
    assert theory_prediction(pure, info, 0.1)["theory_source"] == "theorem1" and envelope_applies(pure, info)
    hw = {**pure, "headwise_rmsnorm": True}
    assert theory_prediction(hw, info, 0.1) == {"theory_regime": "", "theory_source": "headwise_rmsnorm",
                                                 "theory_rate": pytest.approx(float("nan"), nan_ok=True)}
    assert not envelope_applies(hw, info)
    sphere = {**hw, "norm": "sphere", "value": "orthogonal", "input": "hemisphere"}
    assert theory_prediction(sphere, info, 0.1)["theory_source"] == "theorem2"
