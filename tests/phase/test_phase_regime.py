"""Regime labels of the phase sweep on cells with known answers, and the rule itself."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.masks import parse_mask
from rankcollapse.phase.batched import run_group
from rankcollapse.phase.cell import _entropy_per_layer, run_cell
from rankcollapse.phase import expand_grid
from rankcollapse.phase.grid import DEFAULTS
from rankcollapse.phase.regime import (MU_FLOOR, fit_log10_rate, label_cell, label_trajectory, mu_cell, mu_floor, theory_prediction,
                                       trajectory_measures)
from rankcollapse.theory.equilibria import causal_example_2x2


def cell(**over):
    return {**DEFAULTS, **over}


def test_pure_attention_complete_mask_collapses():
    (row,) = run_group([cell(value="orthogonal")], n_samples=2)  # ||W_V||_2 = 1: A2 holds
    assert row["value_log_norm"] == pytest.approx(0.0, abs=1e-9)
    assert row["regime"] == "rank_collapse"
    assert row["mu_relative"] < 1e-6
    assert row["rate"] < 0 and row["rate_lo"] <= row["rate"] <= row["rate_hi"]
    assert row["theory_regime"] == "rank_collapse" and row["theory_source"] == "theorem1"


def test_causal_2x2_construction_from_its_basin_is_stable_rank_2():
    """W_V = [[1,-3],[0,2]], W_Q = W_K = 0, causal, unit sphere: B is locally stable."""
    eqs = causal_example_2x2()
    B = torch.tensor([[0.0, 1.0], list(eqs.info["B"])], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    X0 = B + 0.05 * torch.randn(3, 2, 2, generator=gen, dtype=torch.float64)
    X0 = X0 / X0.norm(dim=-1, keepdim=True)
    W_V = torch.tensor([[1.0, -3.0], [0.0, 2.0]], dtype=torch.float64)
    mask = parse_mask("causal", 2)
    res = simulate(X0, mask=mask, value=W_V, query_key="zero", metrics=("mu_relative",), block="sphere",
                   run=RunConfig(depth=400, dtype=torch.float64, record_states=True, record_attention=True))
    ent = _entropy_per_layer(res.attention, mask.to_dense())
    row = label_cell(trajectory_measures(res.metrics, res.states, ent))
    assert row["regime"] == "stable_rank_k" and row["k"] == 2
    assert torch.allclose(res.states[-1], B.expand(3, 2, 2), atol=1e-8)
    assert row["attention_entropy"] == pytest.approx(1.0, abs=1e-12)  # W_Q = W_K = 0: uniform rows


@pytest.mark.parametrize("mask", ["complete", "causal"])
def test_orthogonal_values_with_sphere_norm_from_a_hemisphere_collapse(mask):
    """Theorem 2: SA + unit-sphere norm, orthogonal W_V, tokens in an open hemisphere."""
    (row,) = run_group([cell(norm="sphere", value="orthogonal", input="hemisphere", mask=mask, depth=128)], n_samples=2)
    assert row["regime"] == "rank_collapse"
    assert row["theory_regime"] == "rank_collapse" and row["theory_source"] == "theorem2"


def test_vanishing_query_key_scale_gives_uniform_attention():
    rows = run_group([cell(qk_scale=0.0), cell(qk_scale=1e-4)], n_samples=2)
    assert rows[0]["attention_entropy"] == pytest.approx(1.0, abs=1e-12)
    assert rows[1]["attention_entropy"] > 0.9999


def test_batched_path_matches_simulate_per_cell():
    cells = [cell(norm="layernorm", placement="pre_ln", alpha=1.0, qk_scale=1.0, value="near_identity"),
             cell(norm="rmsnorm", mask="sliding_window:w=3", value="orthogonal", value_scale=2.0),
             cell(norm="none", d_qk=4, shared=True, value_scale=0.5)]
    for c in cells:
        (got,) = run_group([c], n_samples=2)
        ref = run_cell(c, n_samples=2)
        assert got["regime"] == ref["regime"] and got["k"] == ref["k"]
        for key in ("attention_entropy", "stable_rank", "numerical_rank", "epsilon_measured"):
            assert got[key] == pytest.approx(ref[key], rel=1e-8, abs=1e-12), key
        assert got["mu_relative"] == pytest.approx(ref["mu_relative"], rel=1e-6, abs=1e-13)


SMALL = {"n_tokens": 8, "d_model": 4, "depth": 16, "mask": "causal", "value": "orthogonal"}


@pytest.mark.parametrize("over", [
    dict(norm="layernorm", placement="peri", alpha=1.0), dict(norm="rmsnorm", placement="mix", alpha=1.0),
    dict(norm="layernorm", placement="lns", alpha=1.0), dict(norm="sphere", placement="ngpt", alpha=1.0),
    dict(norm="dyt", placement="pre_ln", alpha=1.0), dict(norm="dyt", placement="none"),
    dict(norm="layernorm", placement="post_ln", alpha=1.0, qk_norm=True),
    dict(norm="sphere", placement="ngpt", alpha=1.0, qk_norm=True, shared=True),
], ids=lambda o: f"{o['norm']}-{o['placement']}-qk{int(o.get('qk_norm', False))}")
def test_batched_path_matches_simulate_per_cell_for_every_normalisation(over):
    """The norms, placements and qk_norm through the sweep's batched fast path
    against the reference path through simulate, cell by cell, decay-law columns included."""
    c = cell(**{**SMALL, **over})
    (got,) = run_group([c], n_samples=2)
    ref = run_cell(c, n_samples=2)
    assert got["regime"] == ref["regime"] and got["law"] == ref["law"] and got["k"] == ref["k"]
    for key in ("mu_relative", "attention_entropy", "stable_rank", "epsilon_measured", "law_exponent", "law_rate",
                "law_r2_exp", "law_r2_power"):
        assert got[key] == pytest.approx(ref[key], rel=1e-8, abs=1e-12), key



def test_batched_rows_do_not_depend_on_the_layers_measured_at_once(monkeypatch):
    """run_group measures its layers in chunks of batched.MEASURE_BYTES (at most the metrics'
    pair budget, so their path is that of one layer); one layer per chunk gives the same
    rows bit for bit, with a batch whose second cell overflows (value scale 200, no norm)."""
    from rankcollapse.metrics._context import PAIR_BUDGET
    from rankcollapse.phase import batched

    assert batched.MEASURE_BYTES <= PAIR_BUDGET
    cells = [cell(n_tokens=8, d_model=4, depth=160, mask="causal", value_scale=v) for v in (1.0, 200.0)]
    rows = run_group(cells, n_samples=3)
    assert [r["frac_diverging"] for r in rows] == [0.0, 1.0]
    monkeypatch.setattr(batched, "MEASURE_BYTES", 1)  # one layer per chunk
    np.testing.assert_equal(run_group(cells, n_samples=3), rows)


def test_layer_metrics_are_the_registrys_bit_for_bit():
    """The per-layer metrics run_group takes on a chunk of layers (simulate's recorded
    path, read off the tokens) equal the registry's (power-of-two-normalised copy) exactly:
    tokens at scale 1, 2^±600 and 1e-300 (each sample its own), and a chunk with a zero
    token (the registry's own path then)."""
    from rankcollapse.metrics import compute_metrics
    from rankcollapse.phase.batched import LAYER_METRICS, _state_measure

    g = torch.Generator().manual_seed(0)
    X = torch.randn(8, 32, 16, generator=g, dtype=torch.float64)
    X[1] *= 2.0 ** 600
    X[2] *= 2.0 ** -600
    X[3] *= 1e-300
    X[4] = X[4, :1]  # one token repeated: mu = 0 exactly
    measure = _state_measure()
    for Y in (X, X[:3]):  # a second chunk of another size through the same scratch buffer
        got, ref = measure(Y), compute_metrics(Y, LAYER_METRICS)
        for name in LAYER_METRICS:
            assert torch.equal(got[name], ref[name]), name
    X[5, 3] = 0.0
    with pytest.warns(UserWarning):
        got, ref = measure(X), compute_metrics(X, LAYER_METRICS)
    for name in LAYER_METRICS:
        assert torch.equal(got[name], ref[name]), name


def test_a_zero_matrix_names_its_cell_layer_and_sample():
    """A value scale 0 makes X(1) the zero matrix, where mu / ||X||_F is undefined: the error
    names the cell, the layer and the sample, not positions in the batch of a chunk."""
    from rankcollapse.errors import MetricError

    cells = [cell(n_tokens=4, d_model=2, depth=3, value_scale=v) for v in (1.0, 0.0)]
    with pytest.raises(MetricError) as info:
        run_group(cells, n_samples=2, seeds=2)
    assert str(info.value) == ("phase cell value_scale=0.0, n_tokens=4, d_model=2, depth=3 (seed 0, sample 0), "
                               "layer 1: X is the zero matrix: mu / ||X||_F is undefined")


def test_zero_tokens_are_warned_once_per_cell(monkeypatch):
    """A layer that zeroes the first token of every sample of the second cell, measured one
    layer per chunk: one ZeroRowWarning, naming that cell and counting its zero tokens
    (depth layers x seeds x samples)."""
    from rankcollapse.metrics import ZeroRowWarning
    from rankcollapse.phase import batched

    layer = batched.single_head_layer

    def zeroing(X, *args, **kwargs):
        X, A, z = layer(X, *args, **kwargs)
        X = X.clone()
        X[X.shape[0] // 2:, 0] = 0.0  # the second cell's half of the batch
        return X, A, z

    monkeypatch.setattr(batched, "single_head_layer", zeroing)
    monkeypatch.setattr(batched, "MEASURE_BYTES", 1)  # one layer per chunk
    cells = [cell(n_tokens=4, d_model=2, depth=5, mask="causal", value_scale=v) for v in (1.0, 0.5)]
    with pytest.warns(ZeroRowWarning) as caught:
        run_group(cells, n_samples=3, seeds=2)
    zero = [str(w.message) for w in caught if issubclass(w.category, ZeroRowWarning)]
    assert zero == ["phase cell value_scale=0.5, mask=causal, n_tokens=4, d_model=2, depth=5: 30 zero token(s) over "
                    "its layers and samples have no direction; they are excluded from cosine metrics"]


def _tr(**over):
    base = {"diverged": False, "mu_relative": 0.5, "norm_ratio": 1.0, "change": 1.0, "k": 3,
            "numerical_rank": 3.0, "stable_rank": 2.0, "rate": -0.1, "attention_entropy": 0.5, "entropy_last": 0.5}
    return {**base, **over}


@pytest.mark.parametrize("over, label", [
    ({"diverged": True}, "diverging"),
    ({"norm_ratio": 1e13}, "diverging"),
    ({"norm_ratio": float("nan")}, "diverging"),
    ({"mu_relative": 1e-7}, "rank_collapse"),
    ({"change": 1e-5}, "stable_rank_k"),
    ({"change": 1e-5, "mu_relative": 1e-4}, "undecided"),   # converged but nearly collapsed
    ({"entropy_last": 0.97}, "uniform_attention"),
    ({"entropy_last": 0.01}, "one_hot_attention"),
    ({"entropy_last": 0.97, "rate_last_bound": -1e-3}, "collapsing_slowly"),  # attention settled, mu still falling
    ({"entropy_last": 0.01, "rate_last_bound": -1e-3}, "collapsing_slowly"),
    ({"entropy_last": 0.97, "rate_last_bound": 1e-3}, "uniform_attention"),
    ({"change": 1e-5, "rate_last_bound": -1e-3}, "stable_rank_k"),
    ({"k": 1}, "aligned_without_consensus"),                # one line, norms differ: m stays up
    ({"k": 1, "change": 1e-5}, "aligned_without_consensus"),  # before stable_rank_k: k = 1 is not a rank-k state
    ({"k": 1, "mu_relative": 1e-4}, "undecided"),            # aligned and nearly consensus
    ({}, "undecided"),
])
def test_label_trajectory_rule(over, label):
    assert label_trajectory(_tr(**over)) == label


def test_label_cell_needs_a_strict_majority():
    two_two = [_tr(mu_relative=1e-9)] * 2 + [_tr(change=0.0)] * 2
    assert label_cell(two_two)["regime"] == "undecided"
    row = label_cell([_tr(change=0.0, k=2)] * 3 + [_tr(mu_relative=1e-9)])
    assert row["regime"] == "stable_rank_k" and row["k"] == 2
    assert row["frac_stable_rank_k"] == 0.75 and row["frac_rank_collapse"] == 0.25


def test_label_cell_rate_interval_is_the_t_interval():
    rows = [_tr(rate=r) for r in (-1.0, -2.0, -3.0)]
    row = label_cell(rows)
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n)
    assert row["rate"] == pytest.approx(-2.0)
    assert row["rate_lo"] == pytest.approx(-2.0 - half) and row["rate_hi"] == pytest.approx(-2.0 + half)


def test_fit_rate_of_an_exact_geometric_decay():
    m = 10.0 ** (-0.5 * np.arange(40))
    # the fit stops where m first drops below 1e-12 (t = 25)
    assert fit_log10_rate(m) == pytest.approx(-0.5, rel=1e-12)
    assert math.isnan(fit_log10_rate(np.array([0.3])))


def test_value_log_norm_is_the_largest_partial_sum_of_log_spectral_norms():
    from rankcollapse.phase.cell import build_weights, value_log_norm

    c = cell(value="gaussian", value_scale=0.7, depth=5)
    logs = [math.log(float(torch.linalg.matrix_norm(lw.W_V, ord=2))) for lw in build_weights(c, 0)]
    expected = max(0.0, *np.cumsum(logs))
    assert value_log_norm(c, range(1)) == pytest.approx(expected, rel=1e-12)
    # every partial product of 0.5 Q has norm <= 1: A2 holds (the empty product gives 0)
    assert value_log_norm(cell(value="orthogonal", value_scale=0.5, depth=4), range(2)) == 0.0
    assert value_log_norm(cell(value="orthogonal", value_scale=2.0, depth=4, shared=True), range(1)) == \
        pytest.approx(4 * math.log(2.0))


def test_value_log_norm_sees_a_partial_product_above_one():
    """Gaussian W_V, a = 0.5, 16 layers, seed 0: the total sum_t ln||W_V(t)|| is -1.34 (the
    old check passed A2) but a partial product has norm e^0.037 > 1, so A2 fails."""
    from rankcollapse.phase import cell as cell_mod

    c = cell(value="gaussian", value_scale=0.5, depth=16)
    logs = [math.log(float(torch.linalg.matrix_norm(lw.W_V, ord=2))) for lw in cell_mod.build_weights(c, 0)]
    assert sum(logs) < -1.0
    assert cell_mod.value_log_norm(c, range(1)) == pytest.approx(max(0.0, *np.cumsum(logs)), rel=1e-12)
    assert cell_mod.value_log_norm(c, range(1)) > 0.03


def test_theory_prediction_sources():
    from rankcollapse.masks.graph import analyze

    info = analyze(parse_mask("causal", 8))
    assert theory_prediction(cell(), info, 0.01)["theory_source"] == "theorem1"
    r = theory_prediction(cell(), info, 0.01)["theory_rate"]
    assert r == pytest.approx(math.log10(1 - 0.01))  # radius 1: (1 - eps^r)^(t/r)
    assert theory_prediction(cell(placement="post_ln", alpha=1.0), info, 0.01)["theory_regime"] == ""
    outside = theory_prediction(cell(), info, 0.01, value_log_norm=0.5)
    assert outside["theory_regime"] == "" and outside["theory_source"] == "pure_sa_outside_A2"
    assert theory_prediction(cell(norm="layernorm"), info, 0.01)["theory_regime"] == ""
    eq = theory_prediction(cell(norm="sphere", value="constructed", qk_scale=0.0, mask="causal", n_tokens=4,
                                d_model=4), info, 0.01)
    # docs/theory.md §3b: the construction's rank-k equilibria have k(k-1)/2 unstable directions
    assert eq["theory_regime"] == "rank_collapse" and eq["theory_source"] == "equilibria"
    for beta in (0.0, "log:0"):  # scores β <x_i, x_j> = 0: the same uniform attention as qk_scale 0
        c = expand_grid({"beta": [beta]}, {"norm": "sphere", "value": "constructed", "mask": "causal", "n_tokens": 4,
                                           "d_model": 4})[0]
        got = theory_prediction(c, info, 0.01)
        assert (got["theory_regime"], got["theory_source"]) == ("rank_collapse", "equilibria"), beta
    nonzero = expand_grid({"beta": [0.5]}, {"norm": "sphere", "value": "constructed", "mask": "causal", "n_tokens": 4,
                                            "d_model": 4})[0]
    assert theory_prediction(nonzero, info, 0.01)["theory_source"] == ""


def test_cell_shows_the_bound_rule_5_reads():
    # every trajectory's own tail bound is below -1e-10 (rule 5), yet the slopes spread so
    # that the t-interval of their mean reaches above 0: the cell must show the former
    trs = [_tr(entropy_last=0.5, rate_last=s, rate_last_bound=s + 1e-3) for s in (-1.0, -0.01)]
    row = label_cell(trs)
    assert row["regime"] == "collapsing_slowly" and row["frac_collapsing_slowly"] == 1.0
    assert row["rate_last_hi"] > 0  # the interval across trajectories, not the rule's bound
    assert row["frac_rate_last_falling"] == 1.0
    assert row["rate_last_bound_max"] == pytest.approx(-0.009, rel=0, abs=1e-15)


def test_sweep_label_checks_against_its_columns():
    # the trial's cell: pre_ln, unit sphere, QK-norm, 16 layers, N = 8, d = 4
    row = run_cell(dict(DEFAULTS, placement="pre_ln", norm="sphere", alpha=1.0, qk_norm=True, qk_scale=1.0,
                        depth=16, n_tokens=8, d_model=4), n_samples=2)
    falling = row["frac_rate_last_falling"]
    assert falling >= row["frac_collapsing_slowly"]  # every collapsing_slowly trajectory passed rule 5
    if row["frac_collapsing_slowly"] == 1.0:
        assert row["rate_last_bound_max"] < -1e-10


def test_cell_mu_never_mixes_the_floor_marker():
    # one trajectory at exactly 0 (the floor marker), one at 1e-16: the mean of the measured one
    assert mu_cell([0.0, 1e-16]) == {"mu_relative": pytest.approx(1e-16, rel=1e-14), "frac_mu_floor": 0.5}
    assert mu_cell([0.0, 1e-301]) == {"mu_relative": MU_FLOOR, "frac_mu_floor": 1.0}  # all at the floor
    # most starts at the floor: the marker, not the mean of the few that are not
    assert mu_cell([0.0, 0.0, 0.0, 0.9]) == {"mu_relative": MU_FLOOR, "frac_mu_floor": 0.75}
    assert mu_cell([1e-4, 1e-2]) == {"mu_relative": pytest.approx(1e-3, rel=1e-14), "frac_mu_floor": 0.0}
    assert math.isnan(mu_cell([])["mu_relative"])


def test_round_off_of_a_consensus_is_the_floor():
    # N = 8, d = 4: m = 0 and m = 2^-54 are both round-off of a consensus (which one a start
    # reaches depends on the kernels' last bits); the cell reads the floor either way
    floor = mu_floor(8, 4)
    assert floor == 24 * np.finfo(np.float64).eps and 2.0 ** -54 < floor
    at_floor = {"mu_relative": MU_FLOOR, "frac_mu_floor": 1.0}
    for mus in ([0.0, 0.0], [0.0, 2.0 ** -54], [2.0 ** -54, 2.0 ** -53], [floor, 0.0]):
        assert mu_cell(mus, floor) == at_floor
    # a value above the floor is a measurement
    assert mu_cell([0.0, 2 * floor], floor) == {"mu_relative": pytest.approx(2 * floor, rel=1e-14), "frac_mu_floor": 0.5}
    assert mu_cell([1e-4, 1e-2], floor) == {"mu_relative": pytest.approx(1e-3, rel=1e-14), "frac_mu_floor": 0.0}


def test_run_cell_mu_at_round_off_is_the_floor():
    # pure SA on the unit sphere, 5 layers, N = 8, d = 4: both starts reach a consensus, m(T)
    # is 0 or ~2^-54 by the machine's last bits; the cell reads the floor on every machine
    row = run_cell(dict(DEFAULTS, norm="sphere", depth=5, n_tokens=8, d_model=4), n_samples=2)
    assert row["frac_mu_floor"] == 1.0 and row["mu_relative"] == MU_FLOOR
    assert row["regime"] == "rank_collapse"
