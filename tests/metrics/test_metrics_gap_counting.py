"""The gap-counting function of attention rows and the fits of its growth: closed forms
(evenly spaced gaps, exact exponential and power counts, the normal tail of Gaussian
logits), padding, refusals."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from rankcollapse.errors import MetricError
from rankcollapse.metrics import gap_counting, gap_growth


def test_evenly_spaced_gaps_count_exactly():
    """z_j = -j/2: the keys within g of the top are those with j <= 2g, so n(g) = min(M, floor(2g) + 1)."""
    M = 9
    z = -0.5 * torch.arange(M, dtype=torch.float64)
    gaps = [0.0, 0.25, 0.5, 0.75, 1.0, 2.0, 3.9, 4.0, 100.0]
    want = [min(M, math.floor(2 * g) + 1) for g in gaps]
    assert gap_counting(z, gaps).tolist() == want
    assert gap_counting(z.flip(0) + 7.0, gaps).tolist() == want  # order and shift do not matter


def test_padding_and_minus_inf_keys_are_not_counted():
    z = torch.tensor([[0.0, -1.0, -2.0, 5.0], [1.0, -math.inf, 0.0, -math.inf], [-math.inf] * 4])
    mask = torch.tensor([True, True, True, False])  # key 3 is padding: its large logit is not the top
    assert gap_counting(z, [0.0, 1.0, 10.0], mask=mask).tolist() == [[1, 2, 3], [1, 2, 2], [0, 0, 0]]


def test_gaussian_logits_follow_the_normal_tail():
    """Given the maximum m of M i.i.d. N(0, 1) logits, each other key lies within g of it with
    probability (Φ(m) - Φ(m - g)) / Φ(m): E[n(g) - 1 | m] = (M - 1) times that. The mean over
    rows of the difference is zero within 5 standard errors (binomial variances)."""
    R, M = 4000, 64
    z = torch.randn(R, M, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    gaps = np.array([0.1, 0.3, 0.6, 1.0, 2.0])
    n = gap_counting(z, gaps).numpy().astype(float)  # (R, G)
    m = z.amax(-1).numpy()[:, None]
    p = (stats.norm.cdf(m) - stats.norm.cdf(m - gaps)) / stats.norm.cdf(m)  # (R, G)
    diff = (n - 1) - (M - 1) * p
    se = np.sqrt(((M - 1) * p * (1 - p)).sum(0)) / R
    assert np.all(np.abs(diff.mean(0)) < 5 * se), (diff.mean(0), se)


def test_growth_fits_recover_exact_exponential_and_power_counts():
    """Gaps u_(k) = ln k / a give n(g) = e^{a g} at every jump (rate a, R²_exp = 1); gaps
    u_(k) = (k / C)^{1/p} for k >= 2 (u_(1) = 0, the maximum) give n(g) = C g^p there
    (exponent p, R²_pow = 1)."""
    k = torch.arange(1, 129, dtype=torch.float64)
    exp_rows = -torch.log(k) / 1.5  # a = 1.5
    pow_rows = torch.where(k > 1, -(k / 4.0) ** 0.5, 0.0)  # C = 4, p = 2
    fit = gap_growth(torch.stack([exp_rows, pow_rows]))
    assert fit["rate"][0].item() == pytest.approx(1.5, rel=1e-12)
    assert fit["r2_exp"][0].item() == pytest.approx(1.0, abs=1e-12)
    assert fit["exponent"][1].item() == pytest.approx(2.0, rel=1e-12)
    assert fit["r2_pow"][1].item() == pytest.approx(1.0, abs=1e-12)
    assert fit["r2_exp"][0] > fit["r2_pow"][0] and fit["r2_pow"][1] > fit["r2_exp"][1]


def test_growth_of_a_row_without_three_points_is_nan():
    fit = gap_growth(torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, -1.0, -math.inf, -math.inf]]))
    assert all(bool(torch.isnan(v).all()) for v in fit.values())


@pytest.mark.parametrize("logits, gaps, match", [
    (torch.tensor([0.0, math.nan]), [1.0], "NaN"),
    (torch.tensor([0.0, math.inf]), [1.0], r"\+inf"),
    (torch.zeros(0), [1.0], "non-empty"),
    (torch.zeros(3), [-1.0], "non-negative"),
    (torch.zeros(3), [[1.0]], "1-D"),
])
def test_bad_input_is_refused(logits, gaps, match):
    with pytest.raises(MetricError, match=match):
        gap_counting(logits, gaps)


def test_bad_mask_and_top_are_refused():
    with pytest.raises(MetricError, match="broadcast"):
        gap_counting(torch.zeros(2, 3), [1.0], mask=torch.ones(4, dtype=torch.bool))
    with pytest.raises(MetricError, match="k_max"):
        gap_growth(torch.zeros(2, 3), k_max=3)
