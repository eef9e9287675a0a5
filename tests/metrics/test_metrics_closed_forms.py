"""Hand-built inputs with answers derived on paper."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.stats import ortho_group

from rankcollapse import metrics as M
from rankcollapse.errors import MetricError

from metrics_numpy_reference import names_at_rank


def _t(a):
    return torch.tensor(a, dtype=torch.float64)


def test_identical_rows_are_fully_collapsed():
    X = _t([[1.0, -2.0, 0.5, 4.0]] * 5)  # dyadic values: the mean is exact
    got = M.compute_metrics(X, names_at_rank(1, M.METRICS))
    with pytest.raises(MetricError, match="alpha_req needs at least 2"):
        M.compute_metrics(X, "all")
    zero = ("mu", "mu_relative", "dong_residual", "dong_residual_relative", "dirichlet_energy", "isoscore")
    one = ("numerical_rank", "stable_rank", "effective_rank", "avg_abs_cos", "avg_cos")
    for name in zero:
        assert float(got[name]) == 0.0, name
    for name in one:
        assert float(got[name]) == pytest.approx(1.0, abs=1e-15), name
    assert float(got["rank_fraction"]) == 1 / 4
    # the SVD of a rank-one matrix leaves sigma_2 at rounding level
    assert float(got["sigma_ratio"]) == pytest.approx(0.0, abs=1e-15)
    assert float(got["rank_one_distance"]) == pytest.approx(0.0, abs=1e-14)
    assert float(got["cos_to_mean"]) == pytest.approx(1.0, abs=1e-15)
    assert float(got["mean_average_distance"]) == pytest.approx(0.0, abs=1e-15)
    for name, spec in M.METRICS.items():
        if name in got and spec.collapse_value is not None:
            assert float(got[name]) == pytest.approx(spec.collapse_value, abs=1e-15), name


@pytest.mark.parametrize("N,d", [(1, 1), (3, 3), (4, 7), (6, 10)])
def test_orthonormal_frame(N, d):
    Q = torch.from_numpy(ortho_group.rvs(d, random_state=N)[:N])  # N orthonormal rows
    got = M.compute_metrics(Q, names_at_rank(N, M.METRICS))
    assert float(got["rank_fraction"]) == 1.0
    assert float(got["sigma_min"]) == pytest.approx(1.0, rel=1e-13)
    assert float(got["avg_abs_cos"]) == pytest.approx(1.0 if N == 1 else 0.0, abs=1e-14)
    assert float(got["stable_rank"]) == pytest.approx(N, rel=1e-13)
    assert float(got["effective_rank"]) == pytest.approx(N, rel=1e-13)
    # mean = (1/N) sum q_i has norm^2 1/N, so mu^2 = N - 1
    assert float(got["mu"]) == pytest.approx(math.sqrt(N - 1), abs=1e-13)
    # complete graph: (1/N) sum_{i != j} ||q_i - q_j||^2 = (1/N) N (N - 1) 2
    assert float(got["dirichlet_energy"]) == pytest.approx(2 * (N - 1), abs=1e-12)
    assert float(got["mean_average_distance"]) == pytest.approx(0.0 if N == 1 else 1.0, abs=1e-14)


def test_tokens_at_plus_minus_v_collapse_to_a_line_that_mu_misses():
    v = _t([3.0, 4.0])
    X = torch.stack([v, -v, v, -v * 2])
    got = M.compute_metrics(X, ("mu", "sigma_ratio", "rank_one_distance", "avg_abs_cos", "avg_cos", "stable_rank"))
    assert float(got["mu"]) > 1.0
    assert float(got["sigma_ratio"]) == pytest.approx(0.0, abs=1e-15)
    assert float(got["rank_one_distance"]) == pytest.approx(0.0, abs=1e-14)
    assert float(got["avg_abs_cos"]) == pytest.approx(1.0, abs=1e-15)
    # signs + - + -: 4 ordered same-sign pairs (+1), 8 opposite (-1) -> (4 - 8) / 12
    assert float(got["avg_cos"]) == pytest.approx(-1 / 3, abs=1e-15)
    assert float(got["stable_rank"]) == pytest.approx(1.0, abs=1e-15)


def test_known_singular_values():
    s = np.array([4.0, 2.0, 2.0, 1.0])
    U = ortho_group.rvs(6, random_state=0)[:, :4]
    V = ortho_group.rvs(5, random_state=1)[:4]
    X = torch.from_numpy(U @ np.diag(s) @ V)
    got = M.compute_metrics(X, "all")
    p = s / s.sum()
    assert float(got["effective_rank"]) == pytest.approx(math.exp(-np.sum(p * np.log(p))), rel=1e-13)
    assert float(got["stable_rank"]) == pytest.approx(25 / 16, rel=1e-13)
    assert float(got["sigma_ratio"]) == pytest.approx(0.5, rel=1e-13)
    assert float(got["rank_one_distance"]) == pytest.approx(3.0, rel=1e-13)
    assert float(got["numerical_rank"]) == 4.0 and float(got["rank_fraction"]) == 4 / 5
    assert float(got["sigma_min"]) == pytest.approx(0.0, abs=1e-13)  # 5th of min(6, 5)


def test_rank_tolerance_is_numpy_rule_and_overridable():
    X = torch.from_numpy(np.diag([1.0, 1e-3, 1e-14]))
    assert float(M.numerical_rank(X)) == 3  # 1e-14 > 3 * eps
    assert float(M.numerical_rank(X, rtol=1e-10)) == 2
    assert float(M.numerical_rank(X, atol=1e-2)) == 1
    assert float(M.compute_metrics(X, ("rank_fraction",), rank_rtol=1e-2)["rank_fraction"]) == 1 / 3
    tiny = torch.from_numpy(np.diag([1.0, 1e-16]))
    assert float(M.numerical_rank(tiny)) == 1  # 1e-16 < 2 * eps
    assert float(M.numerical_rank(torch.zeros(3, 2))) == 0


def test_composite_norm_definition():
    R = _t([[1.0, -2.0], [3.0, 4.0]])
    # induced 1-norm: max column sum = 6; induced inf-norm: max row sum = 7
    assert float(M.composite_norm(R)) == pytest.approx(math.sqrt(42.0), rel=1e-15)
    X = _t([[0.0], [0.0], [0.0], [10.0]])
    # x = mean = 2.5: col sum 15, row max 7.5
    assert float(M.dong_residual(X)) == pytest.approx(math.sqrt(112.5), rel=1e-15)


def _composite(X, x):
    R = X - x
    return math.sqrt(np.abs(R).sum(0).max() * np.abs(R).sum(1).max())


@pytest.mark.parametrize("seed", range(5))
def test_mean_is_within_factor_two_of_the_composite_norm_minimiser(seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_t(2, size=(12, 4))  # heavy tails: the mean is not the minimiser
    at_mean = float(M.dong_residual(torch.from_numpy(X)))
    assert at_mean == pytest.approx(_composite(X, X.mean(0)), rel=1e-14)
    starts = [X.mean(0), np.median(X, 0)] + list(rng.standard_normal((5, 4)))
    best = min(minimize(lambda x: _composite(X, x), x0, method="Nelder-Mead",
                        options={"maxiter": 4000, "xatol": 1e-10, "fatol": 1e-12}).fun for x0 in starts)
    assert best <= at_mean + 1e-12
    assert at_mean <= 2.0 * best


def test_dirichlet_energy_hand_built_causal():
    X = _t([[0.0], [1.0], [3.0]])
    causal = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    # edges i <- j for j < i: (1,0): 1, (2,0): 9, (2,1): 4; self-loops add 0
    assert float(M.dirichlet_energy(X, mask=causal)) == pytest.approx(14 / 3, rel=1e-15)
    assert float(M.dirichlet_energy(X)) == pytest.approx(2 * float(M.mu(X)) ** 2, rel=1e-14)
    assert float(M.dirichlet_energy(2 * X, mask=causal)) == pytest.approx(4 * 14 / 3, rel=1e-15)


def test_mean_average_distance_hand_built():
    X = _t([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    c = 1 - 1 / math.sqrt(2)
    rows = [(1 + c) / 2, (1 + c) / 2, c]
    assert float(M.mean_average_distance(X)) == pytest.approx(sum(rows) / 3, rel=1e-14)
    causal = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    # row 0 has no target pair and is skipped; row 1: d(1,0) = 1; row 2: mean(c, c)
    assert float(M.mean_average_distance(X, mask=causal)) == pytest.approx((1 + c) / 2, rel=1e-14)
    assert float(M.mean_average_distance(X, mask=torch.eye(3, dtype=torch.bool))) == 0.0


def test_single_token_and_single_dimension_conventions():
    one = M.compute_metrics(_t([[2.0, -1.0, 3.0]]), names_at_rank(1, M.METRICS))
    assert float(one["mu"]) == 0.0 and float(one["avg_abs_cos"]) == 1.0 and float(one["avg_cos"]) == 1.0
    assert float(one["rank_fraction"]) == 1.0 and float(one["isoscore"]) == 0.0
    assert float(one["mean_average_distance"]) == 0.0
    line = M.compute_metrics(_t([[1.0], [-2.0], [5.0]]), names_at_rank(1, M.METRICS))
    assert float(line["rank_fraction"]) == 1.0 and float(line["avg_abs_cos"]) == 1.0
    assert float(line["avg_cos"]) == pytest.approx(-1 / 3, rel=1e-15)  # (2 - 4) / 6
    assert float(line["isoscore"]) == 1.0 and float(line["sigma_ratio"]) == 0.0


def test_zero_rows_are_excluded_from_cosines_with_a_warning():
    X = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with_zero = torch.cat([X, torch.zeros(2, 4, dtype=torch.float64)])
    with pytest.warns(M.ZeroRowWarning, match="2 zero token"):
        got = M.compute_metrics(with_zero, ("avg_abs_cos", "avg_cos", "mean_average_distance"))
    want = M.compute_metrics(X, ("avg_abs_cos", "avg_cos", "mean_average_distance"))
    for name in got:
        assert float(got[name]) == pytest.approx(float(want[name]), rel=1e-14), name
    with pytest.raises(MetricError, match="every token is zero"):
        M.avg_abs_cos(torch.zeros(3, 2))
    with pytest.raises(MetricError, match="zero matrix"):
        M.mu_relative(torch.zeros(3, 2))
    with pytest.raises(MetricError, match="mean token is zero"):
        M.cos_to_mean(_t([[1.0, 2.0], [-1.0, -2.0]]))


@pytest.mark.parametrize("N", [2, 7, 128])
def test_max_token_share_one_token_and_equal_norms(N):
    single = torch.zeros(N, 3, dtype=torch.float64)
    single[N // 2] = _t([3.0, -4.0, 12.0])
    got = M.compute_metrics(single, ["max_token_share", "mu_relative"])
    assert float(got["max_token_share"]) == 1.0
    assert float(got["mu_relative"]) == pytest.approx(math.sqrt(1 - 1 / N), rel=1e-14)  # whatever the others were
    equal = torch.from_numpy(ortho_group.rvs(max(N, 2), random_state=0)[:N])  # unit-norm rows
    assert float(M.max_token_share(equal)) == pytest.approx(1 / N, rel=1e-12)
    with pytest.raises(MetricError, match="zero matrix"):
        M.max_token_share(torch.zeros(N, 3, dtype=torch.float64))
