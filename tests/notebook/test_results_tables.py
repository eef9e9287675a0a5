"""Every result object has ``to_pandas()`` with the values of its fields and an HTML
summary for notebooks."""

import numpy as np
import torch

from rankcollapse import dynamics, masks, theory


def test_sim_result_table_matches_metrics():
    res = dynamics.simulate(dynamics.gaussian_tokens(3, 5, 4, seed=1), mask="causal",
                            metrics=["mu", "rank_fraction"], run=dynamics.RunConfig(depth=2))
    df = res.to_pandas()
    assert len(df) == 2 * 3 * 3  # metrics x (depth+1) x samples
    mu = df[df.metric == "mu"].pivot(index="layer", columns="sample", values="value").to_numpy(float)
    assert np.array_equal(mu, res.metrics["mu"].numpy())
    html = res._repr_html_()
    assert "SimResult" in html and "final_mean_mu" in html


def test_mask_analysis_row():
    a = masks.analyze(masks.parse_mask("causal", 7))
    df = a.to_pandas()
    assert len(df) == 1
    row = df.iloc[0]
    assert row["radius"] == 1 and bool(row["quasi_strongly_connected"]) and row["centers"] == "0"
    assert "MaskAnalysis" in a._repr_html_()


def test_equilibria_and_stability_tables():
    eqs = theory.causal_example_2x2().with_stability()
    df = eqs.to_pandas()
    assert len(df) == len(eqs.equilibria) == 10
    assert list(df["rank"]) == [e.rank for e in eqs.equilibria]
    assert list(df["stable"]) == [e.stable for e in eqs.equilibria]
    rep = eqs.equilibria[0].stability
    st = rep.to_pandas()
    assert np.allclose(st["modulus"].max(), rep.spectral_radius)
    assert list(st["verdict"]) == rep.verdicts
    assert "n_equilibria" in eqs._repr_html_()


def test_basin_bound_sphere_tables():
    b = theory.basin_estimate(n_samples=40, depth=30, seed=0)
    row = b.to_pandas().iloc[0]
    assert row["n_hits"] == b.n_hits and row["fraction"] == b.fraction
    bound = theory.check_collapse_bound("causal", n_tokens=4, d_model=3, depth=3, n_samples=2)
    t = bound.to_pandas()
    assert np.allclose(t["mu"].to_numpy(), bound.mu.flatten().numpy())
    assert "BoundResult" in bound._repr_html_()


def test_metric_report_tidy_table_matches_values():
    from rankcollapse.metrics import report_metrics

    X = torch.randn(3, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    X[1] = 1.0  # identical tokens: mu = 0, so mu_relative is 0 (defined) and the angles are defined
    rep = report_metrics(X, ["mu", "rank_fraction", "avg_abs_cos"])
    df = rep.to_pandas()
    assert list(df.columns) == ["sample", "metric", "value", "undefined"]
    assert len(df) == 3 * 3
    for name, values in rep.values.items():
        sub = df[df.metric == name]
        assert list(sub["sample"]) == [0, 1, 2]
        assert np.array_equal(sub["value"].to_numpy(), values.double().numpy())
    # an undefined metric: NaN value, its reason in every row of it
    rep2 = report_metrics(torch.zeros(5, 3), ["mu", "avg_abs_cos"])
    df2 = rep2.to_pandas()
    assert list(df2["sample"]) == [0, 0] and list(df2["metric"]) == ["mu", "avg_abs_cos"]
    assert df2["value"].iloc[0] == 0.0 and df2["undefined"].iloc[0] == ""
    assert np.isnan(df2["value"].iloc[1]) and df2["undefined"].iloc[1] == rep2.undefined["avg_abs_cos"] != ""
    assert "MetricReport" in rep._repr_html_()


def test_mask_analysis_per_token_table():
    a = masks.analyze(masks.parse_mask("causal", 5))
    df = a.to_pandas(per_token=True)
    assert list(df.columns) == ["token", "distance_from_center", "is_center"]
    # causal: token 0 is the only center and token i is one hop from it
    assert list(df["distance_from_center"]) == [0, 1, 1, 1, 1]
    assert list(df["is_center"]) == [True, False, False, False, False]
    assert np.array_equal(df["distance_from_center"].to_numpy(), a.distance_from_center)
    # not quasi-strongly connected (two source components): no distances
    b = masks.analyze(masks.Mask.from_dense(torch.eye(4, dtype=torch.bool)))
    assert not b.quasi_strongly_connected
    assert list(b.to_pandas(per_token=True)["distance_from_center"]) == [-1] * 4


def test_equilibrium_tidy_table():
    eq = theory.causal_example_2x2().equilibria[0]
    df = eq.to_pandas()
    N, d = eq.X.shape
    assert len(df) == N * d
    assert np.array_equal(df.pivot(index="token", columns="coordinate", values="value").to_numpy(), eq.X.numpy())
