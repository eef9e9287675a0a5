"""Theorem 1 envelope, Theorem 2 collapse on the sphere, basins, portraits."""

import math
import warnings

import numpy as np
import pytest
import torch

from rankcollapse.errors import ConfigError
from rankcollapse.theory.basin import basin_estimate
from rankcollapse.theory.bound import EnvelopeViolation, check_collapse_bound, fit_rate, radius_sweep
from rankcollapse.theory.sphere import check_sphere_collapse


def test_fit_rate_recovers_geometric_decay():
    t = torch.arange(30, dtype=torch.float64).unsqueeze(1)
    mu = torch.cat([3.0 * 0.7**t, 2.0 * 0.9**t], dim=1)
    np.testing.assert_allclose(fit_rate(mu).numpy(), [0.7, 0.9], rtol=1e-12)


def test_radius_sweep_rate_slows_with_radius_and_envelope_holds():
    with warnings.catch_warnings():
        warnings.simplefilter("error", EnvelopeViolation)
        table = radius_sweep(16, (16, 9, 5, 3, 2), d_model=8, depth=40, n_samples=4, seed=0)
    assert list(table["radius"]) == [1, 2, 4, 8, 15]
    assert table["measured_rate"].is_monotonic_increasing
    assert table["measured_rate"].iloc[-1] - table["measured_rate"].iloc[0] > 0.2
    assert (table["n_violations"] == 0).all() and (table["measured_rate"] < 1).all()
    assert (table["measured_rate"] <= table["envelope_rate"]).all()


def test_envelope_per_point_and_exponent_variant():
    a = check_collapse_bound("causal", n_tokens=8, d_model=4, depth=20, n_samples=3, exponent="t/r")
    b = check_collapse_bound("causal", n_tokens=8, d_model=4, depth=20, n_samples=3, exponent="t/(2r)")
    assert a.holds and b.holds and bool((a.mu <= a.envelope).all())
    assert bool((b.envelope >= a.envelope - 1e-15).all())  # t/(2r) is the weaker envelope
    # C ≤ sqrt(N) μ(0) / (1 - ε^r)
    C = a.envelope[0]
    assert bool((C <= math.sqrt(8) * a.mu[0] / (1 - a.epsilon_measured) + 1e-12).all())
    assert a.table().shape == (21 * 3, 4)


def test_epsilon_median_and_envelope_rate_describe_one_sample():
    # 8 samples: torch.median takes the lower middle; the rate decreases in ε, so the
    # lower-middle rate belongs to the upper-middle ε (another sample)
    res = check_collapse_bound("causal_sliding_window:w=5", n_tokens=16, d_model=8, depth=20, n_samples=8, seed=0)
    eps_med = float(res.epsilon_measured.median())
    r = res.radius
    assert res.to_dict()["epsilon_measured_median"] == eps_med
    assert res.envelope_rate == pytest.approx((1 - eps_med**r) ** (1 / r), rel=1e-14)
    rates = (1 - res.epsilon_measured**r) ** (1 / r)
    assert float(rates.median()) != pytest.approx(res.envelope_rate, rel=1e-14)  # the test can tell them apart
    table = radius_sweep(16, (5,), d_model=8, depth=20, n_samples=8, seed=0)
    assert table.loc[0, "epsilon_measured"] == eps_med and table.loc[0, "envelope_rate"] == res.envelope_rate


def test_bound_rejects_non_qsc_and_bad_exponent():
    with pytest.raises(ConfigError, match="not quasi-strongly connected"):
        check_collapse_bound("block:size=4", n_tokens=8, depth=2)
    with pytest.raises(ConfigError, match="exponent"):
        check_collapse_bound("causal", n_tokens=8, depth=2, exponent="t")


@pytest.mark.parametrize("mask", ["complete", "causal", "causal_sliding_window:w=3"])
def test_sphere_collapse_needs_nonnegative_cosines(mask):
    ok = check_sphere_collapse(mask, n_tokens=12, d_model=6, depth=80, n_samples=4, beta=8.0)
    assert ok.min_cos0 >= 0 and ok.collapsed and ok.measured_rate < 0.9
    bad = check_sphere_collapse(mask, n_tokens=12, d_model=6, depth=80, n_samples=4, beta=8.0, inputs="antipodal")
    assert bad.min_cos0 < -0.99 and not bad.collapsed and bad.final_mu > 1.0


def test_basin_of_2x2_example_positive_with_interval_and_reproducible():
    b = basin_estimate(n_samples=1500, depth=150, seed=0)
    assert b.n_converged == 1500 and set(b.rank_counts) == {1, 2}
    assert 0.06 < b.fraction < 0.15 and b.ci_low < b.fraction < b.ci_high
    assert b.ci_high - b.ci_low < 0.04
    again = basin_estimate(n_samples=1500, depth=150, seed=0)
    assert again.n_hits == b.n_hits


def test_portrait_2d_arc_matches_closed_form(tmp_path):
    from rankcollapse.theory.basin import portrait_2d, trajectories_3d

    data = portrait_2d(tmp_path / "p.png", n_angles=361, depth=200)
    start, rank2 = data["start_deg"], data["rank2"][1]
    # token 0 at +(0, 1): token 1 reaches B iff it starts between -90° (the antipode of
    # token 0) and the unstable equilibrium ((6+√6)/10, (3√6-2)/10) at 32.33°
    beta = (6 + math.sqrt(6)) / 10
    arc_end = math.degrees(math.atan2(3 * beta - 2, beta))
    assert abs(arc_end - 32.33) < 0.01
    inside = (start > -90 + 1) & (start < arc_end - 1)
    outside = (start < -90 - 1) | (start > arc_end + 1)
    assert rank2[inside].all() and not rank2[outside].any()
    B_deg = math.degrees(math.atan2(-(2 + 3 * math.sqrt(6)) / 10, (6 - math.sqrt(6)) / 10))
    np.testing.assert_allclose(data["final_deg"][1][inside], B_deg, atol=1e-8)
    assert (tmp_path / "p.png").stat().st_size > 10_000
    traj = trajectories_3d(tmp_path / "t.png", n_starts=3, depth=20)
    assert traj.shape == (21, 3, 3, 3) and np.allclose(np.linalg.norm(traj, axis=-1), 1)


def test_bound_curve_is_simulate_with_the_same_seed():
    """The bound's trajectory is simulate's: same seed, same μ(t) (to rounding: the bound
    records A, which takes the explicit-softmax path instead of the fused kernel)."""
    import math

    from rankcollapse.dynamics import RunConfig, gaussian_tokens, simulate

    for qk_scale in (1.0, 0.5):
        res = check_collapse_bound("causal_sliding_window:w=3", n_tokens=8, d_model=4, depth=12, n_samples=3, seed=7,
                                   qk_scale=qk_scale, d_qk=2.0)
        X0 = gaussian_tokens(3, 8, 4, seed=7, std=1 / math.sqrt(4))
        sim = simulate(X0, mask="causal_sliding_window:w=3", d_qk=2.0, value="orthogonal",
                       query_key=res.config["query_key"], metrics=("mu",),
                       run=RunConfig(depth=12, seed=7, dtype=torch.float64))
        torch.testing.assert_close(sim.metrics["mu"], res.mu, rtol=1e-12, atol=0)
