"""The geometry claims' statistics (Spearman across layers with a window bootstrap, a
min over the layers where another metric passes a bound), their synthetic controls
(closed forms), and the claims' controls read through the real rules."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import claims as C
from rankcollapse.experiments import theory_units
from rankcollapse.experiments.config import load_config
from rankcollapse.experiments.controls import evaluate_controls
from rankcollapse.experiments.quantities import EvalContext, MissingData, evaluate, spearman_rows
from rankcollapse.experiments.table import normalise, rows_from_metrics

SEL = {"source": "probe", "model": "m"}


def _table(metrics: dict[str, np.ndarray], **labels) -> pd.DataFrame:
    return rows_from_metrics(metrics, {"source": "probe", "model": "m", "dtype": "float32", **labels})


def test_spearman_rows_matches_scipy_with_ties_and_constants():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(5, 12)), rng.normal(size=(5, 12))
    x[1, :4] = x[1, 0]  # ties share their mean rank
    got = spearman_rows(x, y)
    assert np.allclose(got, [spearmanr(a, b).statistic for a, b in zip(x, y)], rtol=0, atol=1e-12)
    assert math.isnan(spearman_rows(np.ones((1, 5)), y[:1, :5])[0])  # a constant curve has no rank correlation
    assert math.isnan(spearman_rows(x[:1, :2], y[:1, :2])[0])  # fewer than 3 layers


def test_spearman_rows_with_gaps_and_constants_among_full_rows():
    """Rows with a non-finite entry use their finite pairs; a constant row among gap-free
    rows is NaN; every row as if computed alone."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(6, 9)), rng.normal(size=(6, 9))
    x[1, 3], y[2, [0, 5]] = np.nan, np.inf  # gaps
    x[3] = 2.0  # constant
    x[4, 2:] = np.nan  # 2 finite pairs
    got = spearman_rows(x, y)
    for r, keep in ((0, slice(None)), (5, slice(None)), (1, np.isfinite(x[1])), (2, np.isfinite(y[2]))):
        assert got[r] == pytest.approx(spearmanr(x[r, keep], y[r, keep]).statistic, abs=1e-12)
        assert got[r] == spearman_rows(x[r:r + 1], y[r:r + 1])[0]
    assert math.isnan(got[3]) and math.isnan(got[4])


def test_spearman_across_layers_point_interval_and_pairing():
    layers = np.arange(6, dtype=float)[:, None]
    noise = np.array([[0.0, 0.3, -0.2, 0.1]])
    t = _table({"a": layers + noise, "b": -2 * layers + noise, "c": np.cos(layers) + 0 * noise})
    ctx = EvalContext(n_boot=200, seed=1)
    v = evaluate(t, {"stat": "spearman", "metric": "a", "with": "b", "select": SEL}, "default", ctx)
    assert v.point == -1.0 and np.all(v.reps == -1.0) and v.n_samples == 4  # monotone in every replicate
    v = evaluate(t, {"stat": "spearman", "metric": "a", "with": "layer", "select": SEL}, "default", ctx)
    assert v.point == 1.0
    v = evaluate(t, {"stat": "spearman", "metric": "c", "with": "layer", "from_layer": 1, "select": SEL}, "default", ctx)
    assert v.point == pytest.approx(spearmanr(np.arange(1, 6), np.cos(np.arange(1, 6))).statistic, abs=1e-12)
    with pytest.raises(MissingData, match="fewer than 3"):
        evaluate(t, {"stat": "spearman", "metric": "a", "with": "b", "from_layer": 4, "select": SEL}, "default", ctx)


def test_spearman_interval_follows_the_windows():
    """Window 0 says rising, windows 1-3 say falling: the point is the pooled curve's ρ
    and replicates that draw window 0 often enough flip it, so the interval is wide."""
    L = 8
    up, down = np.arange(L, dtype=float), -np.arange(L, dtype=float)
    vals = np.stack([10 * up, down, down, down], axis=1)
    t = _table({"a": vals})
    v = evaluate(t, {"stat": "spearman", "metric": "a", "with": "layer", "select": SEL}, "default",
                 EvalContext(n_boot=500, seed=3))
    assert v.point == 1.0  # pooled mean 10l/4 - 3l/4 rises
    assert np.nanmin(v.reps) == -1.0 and np.nanmax(v.reps) == 1.0


def test_min_where_reads_only_the_layers_passing_the_bound():
    ratio = np.array([1.0, 2.0, 20.0, 30.0, 5.0])[:, None] * np.ones((1, 3))
    share = np.array([0.1, 0.2, 0.95, 0.97, 0.3])[:, None] * np.ones((1, 3))
    t = _table({"max_norm_ratio": ratio, "max_token_sigma_share": share})
    q = {"stat": "min", "metric": "max_token_sigma_share", "select": SEL,
         "where": {"metric": "max_norm_ratio", "op": ">=", "value": 10}}
    ctx = EvalContext(n_boot=50)
    assert evaluate(t, q, "default", ctx).point == pytest.approx(0.95, rel=1e-15)
    assert evaluate(t, {**q, "where": {**q["where"], "op": "<"}}, "default", ctx).point == pytest.approx(0.1, rel=1e-15)
    with pytest.raises(MissingData, match="no layer where max_norm_ratio >= 100"):
        evaluate(t, {**q, "where": {**q["where"], "value": 100}}, "default", ctx)
    with pytest.raises(ConfigError, match="where needs"):
        evaluate(t, {**q, "where": {"metric": "max_norm_ratio", "op": "=="}}, "default", ctx)
    assert "where max_norm_ratio >= 10" in C._qtext(q)


def _synthetic(check: str) -> pd.DataFrame:
    df = getattr(theory_units, f"rows_{check}")({"example_samples": 3}, None)
    return normalise(df, {"experiment": "geometry", "source": "theory", "model": "theory", "variant": check,
                          "dtype": "float64"})


def test_synthetic_controls_closed_forms():
    def curve(check, metric):
        t = _synthetic(check)
        return t[t.metric == metric].sort_values("layer")["mean"].to_numpy()

    assert np.allclose(curve("massive_aligned", "max_token_sigma_share"), 10.5**2 / 127, rtol=1e-12)
    assert np.allclose(curve("massive_aligned", "max_norm_ratio"), 10.5, rtol=1e-12)
    assert np.allclose(curve("massive_spike", "max_token_sigma_share")[1:], 1.0, rtol=1e-12)  # orthogonal row = sigma_1
    assert np.all(np.diff(curve("massive_spike", "matrix_entropy")) < 0)
    assert spearmanr(curve("massive_null", "max_norm_ratio"), np.arange(4)).statistic == 0.0
    assert spearmanr(curve("massive_null", "matrix_entropy"), np.arange(4)).statistic == 0.0
    assert curve("massive_clipped", "effective_rank").min() > 2 * curve("massive_spike", "effective_rank").min()


@pytest.mark.parametrize("cid", ["G1", "G2", "G3", "G4", "G5"])
def test_geometry_claims_controls_read_as_expected(cid):
    """Each claim's rule, redirected by its controls to the synthetic rows, reads
    reproduced (positive) and not reproduced (negative); G3's negative reads the model
    against itself, so it is checked on hand-built probe rows of one condition, and G4's
    negative puts the trained model's first-token mass (hand-built: 0.012 rising to 0.8)
    where the random-init control's equivalence test reads; G5 reads a hand-built
    contribution a tenth of that mass."""
    claim = next(c for c in load_config("geometry")["claims"] if c["id"] == cid)
    parts = [_synthetic(c) for c in ("massive_spike", "massive_clipped", "massive_null", "massive_aligned")]
    erank = np.linspace(60, 8, 31)[:, None] * np.ones((1, 3))
    parts.append(rows_from_metrics({"effective_rank": erank}, {"source": "probe", "model": "smollm2", "variant": "full",
                                                               "value": "pretrained", "dtype": "float32"}))
    sink = np.r_[0.012, np.linspace(0.012, 0.8, 30)][:, None] * np.array([[1.0, 1.01, 0.99]])  # layers 0, 1..30
    parts.append(rows_from_metrics({"sink_mass": sink, "sink_contribution": sink / 10},
                                   {"source": "probe", "model": "smollm2", "variant": "full", "value": "pretrained",
                                    "dtype": "float32"}))
    res = evaluate_controls(pd.concat(parts, ignore_index=True), claim, n_boot=100)
    assert res["positive"]["verdict"] == "reproduced", res["positive"]
    if cid == "G3":
        assert res["negative"]["verdict"] == "not reproduced" and res["negative"]["measured"] == 1.0
    else:
        assert res["negative"]["verdict"] == "not reproduced", res["negative"]
    assert res["ok"] is True


def test_probe_units_of_one_condition_measure_disjoint_metrics():
    """In `all`, probe units of the same model and intervention are one condition of the
    table: two different units giving the same metric there would mix their rows (the
    geometry probes once also measured mu_relative, which fig2's claims read)."""
    from rankcollapse.experiments import runner

    _, units, _ = runner.plan("all", "quick", 0)
    seen: dict[tuple, dict[str, str]] = {}
    for u in units:
        if u.kind != "probe":
            continue
        p = u.params
        cond = (p["model"], tuple(p.get("drop", ())), p.get("control"), bool(p.get("clip_massive")))
        for metric in p.get("metrics", ()):
            other = seen.setdefault(cond, {}).setdefault(metric, u.hash)
            assert other == u.hash, (cond, metric, u.label)


def test_selection_threshold_band_finds_g1_flip_points():
    """G1's shape: the layers with max_norm_ratio >= theta are read; ratios 9.6 and 12.2
    carry shares 0.33 and 0.895, so theta = 10 keeps the 0.895 layer and the 25.0 one
    (fails), theta below 9.6 adds 0.33 (fails), theta above 12.2 keeps only 0.97 (holds):
    the rule flips at 12.2 inside the band 5 to 20, exactly there."""
    from rankcollapse.experiments import claims as C

    ratio = np.array([1.0, 9.6, 12.2, 25.0])[:, None] * np.ones((1, 4))
    share = np.array([0.1, 0.33, 0.895, 0.97])[:, None] * np.ones((1, 4))
    t = _table({"max_norm_ratio": ratio, "max_token_sigma_share": share})
    claim = {"id": "G", "effect": "e", "rule": {"checks": [{
        "name": "share", "op": ">=", "rhs": {"const": 0.9}, "band": [0.85, 0.95],
        "lhs": {"stat": "min", "metric": "max_token_sigma_share", "select": SEL,
                "where": {"metric": "max_norm_ratio", "op": ">=", "value": 10}}}]}}
    res = C.evaluate_claim(t, claim, n_boot=50)
    assert res["verdict_at_threshold"] == "not reproduced" and res["verdict"] == C.THRESHOLD_SENSITIVE
    where = next(b for b in res["bands"] if "where max_norm_ratio" in b["threshold"])
    assert where["band"] == [5.0, 20.0] and where["verdict_low"] == "not reproduced"
    assert [(f["at"], f["below"], f["above"]) for f in where["flips"]] == [
        (pytest.approx(12.2), "not reproduced", "reproduced")]
    assert where["flip_point"] == pytest.approx(12.2)
