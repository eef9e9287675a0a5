"""IsoScore: closed forms derived from Rudman et al. (2022) Algorithm 1."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import ortho_group

import metrics_numpy_reference as ref
from rankcollapse.metrics import isoscore


def _isotropic_in_k_dims(k: int, n: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """Points ±e_1..±e_k rotated into a random k-dimensional subspace of R^n:
    mean 0 and covariance exactly proportional to the projector onto the subspace."""
    frame = np.vstack([np.eye(k), -np.eye(k)])
    Q = ortho_group.rvs(n, random_state=seed) if n > 1 else np.ones((1, 1))
    return scale * np.hstack([frame, np.zeros((2 * k, n - k))]) @ Q


@pytest.mark.parametrize("k,n", [(1, 2), (2, 2), (1, 5), (3, 5), (5, 5), (4, 10), (7, 16), (16, 16)])
def test_points_spread_isotropically_over_k_of_n_dimensions(k, n):
    X = torch.from_numpy(_isotropic_in_k_dims(k, n, seed=k + n))
    assert float(isoscore(X)) == pytest.approx((k - 1) / (n - 1), abs=1e-12)


@given(st.integers(1, 12), st.integers(2, 12), st.integers(0, 10_000), st.floats(1e-3, 1e3))
def test_closed_form_is_scale_and_rotation_invariant(k, n, seed, scale):
    k = min(k, n)
    X = torch.from_numpy(_isotropic_in_k_dims(k, n, seed, scale) + 7.0)  # shift: centred away
    assert float(isoscore(X)) == pytest.approx((k - 1) / (n - 1), abs=1e-10)


def test_known_variance_vector():
    # Points ±sqrt(2 lam_i) e_i have covariance (up to a common factor) diag(lam).
    lam = np.array([4.0, 1.0, 1.0, 0.0])
    X = np.vstack([np.diag(np.sqrt(lam)), -np.diag(np.sqrt(lam))])
    n = 4
    hat = math.sqrt(n) * lam / np.linalg.norm(lam)
    delta2 = np.sum((hat - 1) ** 2) / (2 * (n - math.sqrt(n)))
    phi = (n - delta2 * (n - math.sqrt(n))) ** 2 / n**2
    assert float(isoscore(torch.from_numpy(X))) == pytest.approx((n * phi - 1) / (n - 1), rel=1e-13)


@given(st.integers(1, 3), st.integers(1, 15), st.integers(1, 10), st.integers(0, 2**31 - 1))
def test_matches_step_by_step_reference_batched(B, N, d, seed):
    X = np.random.default_rng(seed).standard_normal((B, N, d))
    got = isoscore(torch.from_numpy(X))
    for b in range(B):
        assert float(got[b]) == pytest.approx(ref.isoscore(X[b]), rel=1e-10, abs=1e-12)
        assert 0.0 <= float(got[b]) <= 1.0


def test_fewer_tokens_than_dimensions_bound():
    # N points span at most N - 1 centred directions: IsoScore <= (N - 2) / (d - 1).
    X = torch.from_numpy(_isotropic_in_k_dims(3, 9, seed=0))  # 6 points, isotropic in 3 dims
    assert float(isoscore(X)) == pytest.approx(2 / 8, abs=1e-12)
    rng = np.random.default_rng(1)
    for N, d in [(4, 10), (8, 20)]:
        assert float(isoscore(torch.from_numpy(rng.standard_normal((N, d))))) <= (N - 2) / (d - 1) + 1e-12


def test_degenerate_conventions():
    assert float(isoscore(torch.ones(5, 3, dtype=torch.float64))) == 0.0  # zero covariance
    assert float(isoscore(torch.tensor([[1.0], [2.0]]))) == 1.0  # d = 1, positive variance
    assert float(isoscore(torch.tensor([[1.0], [1.0]]))) == 0.0  # d = 1, zero variance
