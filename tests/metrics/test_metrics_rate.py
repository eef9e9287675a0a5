"""The one least-squares rate fit (metrics.rate.least_squares_rate) and its three callers.

Values against closed forms and numpy's polyfit; the callers' numbers against the
formulas they used before they shared the fit (frozen copies below), bit for bit."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.errors import ConfigError
from rankcollapse.metrics.rate import least_squares_rate


def test_exact_exponentials_give_their_factor_in_both_libraries():
    t = np.arange(12.0)
    v = np.stack([0.5**t, 0.9**t, 3 * 1.1**t], axis=1)
    for x in (v, torch.from_numpy(v)):
        fit = least_squares_rate(x, floor=0.0)
        np.testing.assert_allclose(np.asarray(fit.rate), [0.5, 0.9, 1.1], rtol=1e-13)
        np.testing.assert_allclose(np.asarray(fit.decades), np.log10([0.5, 0.9, 1.1]), rtol=1e-13)
        assert list(np.asarray(fit.n_layers)) == [12, 12, 12]


def test_noisy_slope_equals_polyfit():
    rng = np.random.default_rng(3)
    t = np.arange(30.0)
    v = np.exp(-0.3 * t + rng.normal(0, 0.2, 30))
    assert least_squares_rate(v, floor=0.0).slope[0] == pytest.approx(np.polyfit(t, np.log(v), 1)[0], rel=1e-12)
    layers = np.arange(5.0, 35.0)  # abscissae shift the intercept, not the slope
    assert least_squares_rate(v, floor=0.0, layers=layers).slope[0] == pytest.approx(np.polyfit(t, np.log(v), 1)[0],
                                                                                     rel=1e-12)


def test_the_floor_leaves_points_out():
    v = np.array([1.0, 0.1, 0.01, 1e-20, 1e-3, 1e-25])
    every = least_squares_rate(v, floor=1e-16)  # the layers above the floor: 0, 1, 2, 4
    assert every.n_layers[0] == 4
    assert every.slope[0] == pytest.approx(np.polyfit([0, 1, 2, 4], np.log(v[[0, 1, 2, 4]]), 1)[0], rel=1e-12)
    before = least_squares_rate(v, floor=1e-16, before_floor=True)  # only before the first at the floor
    assert before.n_layers[0] == 3 and before.rate[0] == pytest.approx(0.1, rel=1e-12)
    per_column = least_squares_rate(np.stack([v, v], 1), floor=np.array([1e-16, 0.05]))
    assert list(per_column.n_layers) == [4, 2]  # a floor per column (relative floors)


def test_fewer_than_two_layers_is_nan_not_a_rate():
    fit = least_squares_rate(np.array([[1.0, 1.0], [1e-30, 0.5]]), floor=1e-16)
    assert math.isnan(fit.slope[0]) and fit.slope[1] == pytest.approx(math.log(0.5))
    shared = least_squares_rate(np.array([[1.0, 1.0], [1e-30, 0.5]]), floor=1e-16, shared=True)
    assert np.isnan(shared.slope).all() and list(shared.n_layers) == [1, 1]


def test_shared_fits_every_column_on_column_zeros_layers():
    v = np.array([[1.0, 2.0], [0.5, 0.0], [1e-30, 0.3], [1e-31, 0.2]])
    fit = least_squares_rate(v, floor=1e-16, shared=True)  # layers 0, 1 (column 0); column 1 clipped at tiny
    assert fit.rate[0] == pytest.approx(0.5, rel=1e-13)
    assert fit.slope[1] == pytest.approx(math.log(np.finfo(np.float64).tiny) - math.log(2.0), rel=1e-13)


@pytest.mark.parametrize("bad", [np.zeros((2, 2, 2)), np.zeros(0), torch.zeros(2, 2, 2)])
def test_bad_values_are_refused(bad):
    with pytest.raises(ConfigError):
        least_squares_rate(bad, floor=0.0)


def test_bad_layers_and_shared_tensor_are_refused():
    with pytest.raises(ConfigError, match="layers"):
        least_squares_rate(np.ones(4), floor=0.0, layers=np.arange(3.0))
    with pytest.raises(ConfigError, match="numpy"):
        least_squares_rate(torch.ones(4, 2, dtype=torch.float64), floor=0.0, shared=True)


# ---- the callers' numbers are those of the formulas they had -----------------------
def _old_bound(mu, floor=1e-12):
    T = mu.shape[0]
    t = torch.arange(T, dtype=torch.float64).unsqueeze(1).expand_as(mu)
    keep = (mu > floor * mu[:1]) & (mu > 1e-280)
    w = keep.double()
    n = w.sum(0).clamp_min(1)
    y = torch.where(keep, mu.clamp_min(1e-300).log(), torch.zeros_like(mu))
    tm, ym = (w * t).sum(0) / n, (w * y).sum(0) / n
    slope = (w * (t - tm) * (y - ym)).sum(0) / (w * (t - tm) ** 2).sum(0).clamp_min(1e-300)
    return slope.exp()


def _old_quantities(M, layers, floor, start, top):
    keep = (layers >= start) & (np.arange(len(layers)) <= top) & (M[0] > max(floor, 0.0))
    x = layers[keep].astype(np.float64)
    with np.errstate(all="ignore"):
        y = np.log(np.maximum(M[:, keep], np.finfo(np.float64).tiny))
    xc = x - x.mean()
    return np.exp((y - y.mean(axis=1, keepdims=True)) @ xc / (xc @ xc))


def _decays(rng, T, B):
    t = np.arange(T)[:, None]
    return np.exp(-rng.uniform(0.05, 3, B) * t + rng.normal(0, 0.3, (T, B)))


def test_theory_fit_rate_is_bit_for_bit_the_old_formula():
    from rankcollapse.theory import fit_rate

    rng = np.random.default_rng(0)
    for T in (2, 5, 17, 61):
        mu = torch.from_numpy(_decays(rng, T, 8))
        mu[-1, 0] = 0.0  # a zero μ and a collapsed sample (old value: factor 1)
        mu[1:, 1] = 1e-300
        assert torch.equal(fit_rate(mu), _old_bound(mu))
        assert torch.equal(fit_rate(mu, floor=1e-6), _old_bound(mu, floor=1e-6))


def test_claims_rate_is_bit_for_bit_the_old_formula():
    from rankcollapse.experiments.quantities import EvalContext, _rate

    rng = np.random.default_rng(1)
    for i in range(40):
        L = int(rng.integers(5, 65))
        layers = np.arange(L)
        M = np.maximum(_decays(rng, L, 1).T * np.exp(rng.normal(0, 0.05, (59, L))), [0.0, 2.2e-16, 1e-7][i % 3])
        floor = [0.0, 2.2e-16, 1e-7][i % 3]
        q = {"metric": "mu_relative", "from_layer": int(rng.integers(0, 2))}
        top = L - 1
        try:
            old = _old_quantities(M, layers, floor, q["from_layer"], top)
        except ZeroDivisionError:
            continue
        if np.sum((layers >= q["from_layer"]) & (M[0] > floor)) < 2:
            continue
        assert np.array_equal(_rate(M, layers, q, EvalContext(), False, floor), old)


def test_phase_rate_is_the_old_polyfit_to_round_off():
    from rankcollapse.phase.regime import RATE_FLOOR, fit_log10_rate

    rng = np.random.default_rng(2)
    for T in (3, 9, 40):
        for m in _decays(rng, T, 6).T:
            below = np.nonzero(~(m >= RATE_FLOOR))[0]
            stop = int(below[0]) if below.size else m.size
            if stop >= 2:
                old = np.polyfit(np.arange(stop, dtype=np.float64), np.log10(m[:stop]), 1)[0]
                assert fit_log10_rate(m) == pytest.approx(old, rel=1e-14, abs=1e-15)
    assert fit_log10_rate(np.array([0.5, 1e-20, 1e-30])) == np.log10(RATE_FLOOR) - np.log10(0.5)  # fell in one layer
    assert math.isnan(fit_log10_rate(np.array([1e-20, 1e-30])))


# ---- exponential against power law (fit_decay_law) -----------------------------------------

def test_exact_exponential_and_power_law_are_told_apart():
    from rankcollapse.metrics.rate import fit_decay_law

    t = np.arange(65.0)
    exp_ = 0.3 * np.exp(-0.2 * t)
    pow_ = 0.3 * np.maximum(t, 1.0) ** -2.0  # t = 0 is left out (log t)
    fit = fit_decay_law(np.stack([exp_, pow_], axis=1), floor=0.0)
    assert list(fit.law) == ["exponential", "power"]
    np.testing.assert_allclose(fit.r2_exponential[0], 1.0, rtol=0, atol=1e-13)
    np.testing.assert_allclose(fit.r2_power[1], 1.0, rtol=0, atol=1e-13)
    # the wrong law scores corr(t, log t)^2 in both cases (R^2 is a squared correlation)
    assert fit.r2_power[0] < 0.9 and fit.r2_exponential[1] < 0.9
    np.testing.assert_allclose(fit.rate[0], -0.2, rtol=1e-12)
    np.testing.assert_allclose(fit.exponent[1], -2.0, rtol=1e-12)
    assert list(fit.n_layers) == [64, 64]


def test_law_r_squared_equals_polyfit_on_noise():
    """Independent reference: R^2 = 1 - SSR/SST of numpy's polyfit residuals. Pure noise
    around a constant has no law: both R^2 small; a noisy power law is called a power law."""
    from rankcollapse.metrics.rate import fit_decay_law

    rng = np.random.default_rng(5)
    t = np.arange(1.0, 65.0)
    noise = np.exp(rng.normal(0, 0.3, (64, 2)))
    noisy_power = 0.5 * t**-1.5 * np.exp(rng.normal(0, 0.05, 64))
    v = np.column_stack([noise, noisy_power])
    fit = fit_decay_law(v, floor=0.0, layers=t)

    def r2(x, y):
        res = y - np.polyval(np.polyfit(x, y, 1), x)
        return 1 - (res @ res) / ((y - y.mean()) @ (y - y.mean()))

    for b in range(3):
        y = np.log(v[:, b])
        assert fit.r2_exponential[b] == pytest.approx(r2(t, y), rel=1e-9)
        assert fit.r2_power[b] == pytest.approx(r2(np.log(t), y), rel=1e-9)
    assert max(fit.r2_exponential[:2].max(), fit.r2_power[:2].max()) < 0.2
    assert fit.law[2] == "power" and fit.exponent[2] == pytest.approx(-1.5, abs=0.05)


def test_law_fit_stops_at_the_floor_and_needs_three_layers():
    from rankcollapse.metrics.rate import fit_decay_law

    t = np.arange(10.0)
    v = np.exp(-t)
    v[6:] = 1e-20  # round-off: left out, with everything after it
    fit = fit_decay_law(v, floor=1e-16)
    assert fit.n_layers[0] == 5 and fit.law[0] == "exponential"
    short = fit_decay_law(np.array([1.0, 0.5, 0.25]), floor=0.0)  # two layers with t > 0
    assert np.isnan(short.r2_power[0]) and short.law[0] == "undecided"
    assert fit_decay_law(torch.from_numpy(v), floor=1e-16).rate[0] == pytest.approx(-1.0, rel=1e-12)
    with pytest.raises(ConfigError):
        fit_decay_law(np.ones((2, 2, 2)), floor=0.0)


def test_a_trajectory_that_does_not_decay_has_no_decay_law():
    """A rising or flat gap fits a line in log v (R^2 = 1 for a growing exponential) but
    has no decay law; the decaying one beside it keeps its law."""
    from rankcollapse.metrics.rate import fit_decay_law

    t = np.arange(33.0)
    v = np.stack([np.exp(0.1 * t), np.full(33, 0.3), np.exp(-0.1 * t)], axis=1)
    fit = fit_decay_law(v, floor=0.0)
    assert fit.r2_exponential[0] == pytest.approx(1.0, abs=1e-12)
    assert list(fit.law) == ["undecided", "undecided", "exponential"]
