"""Geometry metrics (massive tokens, spectrum shape) against closed-form spectra built as
``X = U diag(s) V^T`` with known s, and against numpy float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import ortho_group

from rankcollapse import metrics as M
from rankcollapse.errors import MetricError

import metrics_numpy_reference as ref

GEOMETRY = ("max_norm_ratio", "max_norm_position", "top_singular_share", "max_token_sigma_share",
            "matrix_entropy", "alpha_req")


def _with_spectrum(s, N, d, seed=0) -> np.ndarray:
    """``U diag(s) V^T`` ``(N, d)`` with Haar-random orthonormal U, V: singular values exactly s."""
    k = len(s)
    U = ortho_group.rvs(N, random_state=seed)[:, :k]
    V = ortho_group.rvs(d, random_state=seed + 1)[:, :k]
    return U @ np.diag(s) @ V.T


@pytest.mark.parametrize("a", [0.5, 1.0, 2.0, 3.7])
def test_alpha_req_recovers_the_exponent_of_a_power_law(a):
    k = 12
    s = 3.0 * np.arange(1, k + 1) ** (-a / 2)  # lambda_i = sigma_i^2 = 9 i^-a
    X = _with_spectrum(s, 16, 20)
    assert float(M.alpha_req(X)) == pytest.approx(a, rel=1e-10)
    assert float(M.alpha_req(X)) == pytest.approx(ref.alpha_req(X), rel=1e-10)


def test_alpha_req_fits_only_up_to_the_numerical_rank():
    s = np.r_[np.arange(1, 6) ** -1.0, np.zeros(3)]  # rank 5 of 8; the zeros are rounding after U, V
    X = _with_spectrum(s, 10, 8)
    assert float(M.alpha_req(X)) == pytest.approx(2.0, rel=1e-10)


def test_alpha_req_refuses_rank_one():
    with pytest.raises(MetricError, match="alpha_req needs at least 2"):
        M.alpha_req(np.outer(np.arange(1.0, 5.0), np.ones(3)))
    with pytest.raises(MetricError, match="alpha_req needs at least 2"):
        M.alpha_req(np.ones((1, 7)))


@pytest.mark.parametrize("k", [1, 2, 5, 9])
def test_matrix_entropy_of_a_flat_spectrum_is_log_k(k):
    X = _with_spectrum(np.full(k, 2.5), 11, 9)
    assert float(M.matrix_entropy(X)) == pytest.approx(math.log(k), abs=1e-13)
    assert float(M.top_singular_share(X)) == pytest.approx(1 / k, rel=1e-13)


def test_matrix_entropy_and_top_share_on_a_hand_spectrum():
    s = np.array([3.0, 2.0, 1.0, 1.0])  # sigma^2 = 9, 4, 1, 1; sum 15
    X = _with_spectrum(s, 7, 6, seed=3)
    p = np.array([9, 4, 1, 1]) / 15
    assert float(M.matrix_entropy(X)) == pytest.approx(-np.sum(p * np.log(p)), rel=1e-13)
    assert float(M.top_singular_share(X)) == pytest.approx(9 / 15, rel=1e-13)
    assert float(M.top_singular_share(X)) == pytest.approx(1 / float(M.stable_rank(X)), rel=1e-14)


def test_massive_first_token_closed_forms():
    # token 0 = 100 e_1, tokens 1..4 orthonormal e_2..e_5 of norm 1: sigma = (100, 1, 1, 1, 1)
    X = np.zeros((5, 8))
    X[0, 0] = 100.0
    X[np.arange(1, 5), np.arange(1, 5)] = 1.0
    got = M.compute_metrics(X, GEOMETRY)
    assert float(got["max_norm_ratio"]) == 100.0
    assert float(got["max_norm_position"]) == 0.0
    assert float(got["top_singular_share"]) == pytest.approx(1e4 / (1e4 + 4), rel=1e-14)
    assert float(got["max_token_sigma_share"]) == pytest.approx(1.0, rel=1e-14)
    p = np.array([1e4, 1, 1, 1, 1]) / (1e4 + 4)
    assert float(got["matrix_entropy"]) == pytest.approx(-np.sum(p * np.log(p)), rel=1e-12)


def test_max_norm_ratio_uses_numpy_median_and_first_position_on_ties():
    X = np.diag([1.0, 2.0, 4.0, 4.0])  # norms 1, 2, 4, 4: median (2 + 4) / 2 = 3
    assert float(M.max_norm_ratio(X)) == pytest.approx(4 / 3, rel=1e-15)
    assert float(M.max_norm_position(X)) == 2.0
    with pytest.raises(MetricError, match="median token norm is 0"):
        M.max_norm_ratio(np.r_[np.zeros((2, 3)), np.ones((1, 3))])


def test_largest_row_share_of_sigma1_is_at_most_one_and_exact_for_orthogonal_rows():
    rng = np.random.default_rng(7)
    for _ in range(20):
        X = rng.standard_normal((9, 6)) * rng.uniform(0.1, 10, (9, 1))
        assert float(M.max_token_sigma_share(X)) <= 1.0 + 1e-14
        assert float(M.max_token_sigma_share(X)) == pytest.approx(ref.max_token_sigma_share(X), rel=1e-12)
    Q = ortho_group.rvs(6, random_state=1)[:4] * np.array([[5.0], [1.0], [2.0], [3.0]])  # orthogonal rows
    assert float(M.max_token_sigma_share(Q)) == pytest.approx(1.0, rel=1e-13)


def test_batched_padded_equals_each_sample_alone_and_numpy():
    rng = np.random.default_rng(11)
    X = rng.standard_normal((3, 9, 5))
    X[:, 2] *= 40.0  # a massive token at position 2
    pm = np.ones((3, 9), bool)
    pm[0, 7:] = False  # right padding
    pm[2, :2] = False  # left padding: the massive token is real token 0 of sample 2
    X[~pm] = 1e30  # padded rows hold garbage
    got = M.compute_metrics(torch.from_numpy(X), GEOMETRY, padding_mask=torch.from_numpy(pm))
    for b in range(3):
        real = X[b][pm[b]]
        for name in GEOMETRY:
            assert float(got[name][b]) == pytest.approx(ref.ALL[name](real), rel=1e-10, abs=1e-12), (b, name)
    assert got["max_norm_position"].tolist() == [2.0, 2.0, 0.0]


def test_scale_invariant_and_float32_close():
    X = torch.randn(2, 12, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = M.compute_metrics(X, GEOMETRY)
    b = M.compute_metrics(X * 2.0**40, GEOMETRY)
    for name in GEOMETRY:
        assert torch.equal(a[name], b[name]), name
    f32 = M.compute_metrics(X.float(), GEOMETRY)
    for name in GEOMETRY:
        torch.testing.assert_close(f32[name].double(), a[name], rtol=1e-4, atol=1e-4)
