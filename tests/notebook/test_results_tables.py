"""Every result object has ``to_pandas()`` with the values of its fields and an HTML
summary for notebooks."""

import numpy as np
import torch

from rankcollapse import dynamics, masks, theory


def test_sim_result_table_matches_metrics():
    res = dynamics.simulate(dynamics.gaussian_tokens(3, 5, 4, seed=1), mask="causal", depth=2,
                            metrics=["mu", "rank_fraction"])
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
    bound = theory.check_collapse_bound("causal", n=4, d=3, depth=3, n_samples=2)
    t = bound.to_pandas()
    assert np.allclose(t["mu"].to_numpy(), bound.mu.flatten().numpy())
    assert "BoundResult" in bound._repr_html_()
