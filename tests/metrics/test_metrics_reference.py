"""Agreement with independent numpy float64 implementations on random inputs."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import metrics_numpy_reference as ref
from rankcollapse.errors import MetricError
from rankcollapse.metrics import METRICS, ZeroRowWarning, compute_metrics

RTOL = 1e-10
# Metrics whose value scales with X (absolute error ~ eps * ||X||) vs scale-free ones.
SCALED = {"mu", "sigma_min", "rank_one_distance", "dong_residual", "dirichlet_energy"}


def _assert_matches(X: np.ndarray, got: dict, names, M=None):
    scale = max(float(np.linalg.norm(X)), 1.0)
    for name in names:
        fn = ref.ALL[name]
        want = fn(X, M) if name in ("dirichlet_energy", "mean_average_distance") else fn(X)
        atol = 1e-12 * (scale**2 if name == "dirichlet_energy" else scale if name in SCALED else 1.0)
        assert math.isfinite(float(got[name])), name
        assert float(got[name]) == pytest.approx(want, rel=RTOL, abs=atol), name


shapes = st.tuples(st.integers(1, 3), st.integers(1, 12), st.integers(1, 12), st.integers(0, 2**31 - 1))


@given(shapes)
def test_all_metrics_match_numpy_float64(shape):
    B, N, d, seed = shape
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((B, N, d)) * rng.uniform(0.01, 100)
    names = ref.names_at_rank(min(N, d), METRICS)  # Gaussian X has full rank min(N, d)
    got = compute_metrics(torch.from_numpy(X), names)
    for b in range(B):
        _assert_matches(X[b], {k: v[b] for k, v in got.items()}, names)


@given(st.integers(1, 10), st.integers(1, 10), st.integers(0, 2**31 - 1))
def test_unbatched_matches_numpy_and_returns_0d(N, d, seed):
    X = np.random.default_rng(seed).standard_normal((N, d))
    names = ref.names_at_rank(min(N, d), METRICS)
    got = compute_metrics(X, names)
    assert all(v.ndim == 0 and v.dtype == torch.float64 for v in got.values())
    _assert_matches(X, got, names)


@given(st.integers(2, 10), st.integers(1, 10), st.integers(0, 2**31 - 1))
def test_graph_metrics_match_numpy_on_random_masks(N, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, d))
    M = rng.random((N, N)) < 0.4
    got = compute_metrics(X, ("dirichlet_energy", "mean_average_distance"), mask=torch.from_numpy(M))
    _assert_matches(X, got, ("dirichlet_energy", "mean_average_distance"), M)


@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_rank_matches_numpy_matrix_rank_on_low_rank_products(N, d, r, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, r)) @ rng.standard_normal((r, d))
    got = compute_metrics(X, ("numerical_rank", "rank_fraction"))
    assert float(got["numerical_rank"]) == np.linalg.matrix_rank(X) == min(N, d, r)
    assert float(got["rank_fraction"]) == pytest.approx(min(N, d, r) / min(N, d), abs=0)


@given(st.integers(1, 8), st.integers(1, 8), st.integers(0, 2**31 - 1), st.integers(0, 3))
def test_never_a_silent_nan(N, d, seed, n_special):
    """Duplicated, zero and opposite tokens give finite values or a MetricError."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, d))
    for i in range(min(n_special, N)):
        X[i] = [0.0, X[0], -X[-1]][int(rng.integers(3))]
    for name in METRICS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ZeroRowWarning)
            try:
                value = compute_metrics(X, (name,))[name]
            except MetricError:
                continue
        assert math.isfinite(float(value)), name


def test_float64_option_on_float32_input():
    X32 = torch.randn(3, 20, 16, generator=torch.Generator().manual_seed(1))
    got = compute_metrics(X32, "all", dtype=torch.float64)
    want = compute_metrics(X32.double(), "all")
    for name in METRICS:
        assert got[name].dtype == torch.float64
        assert torch.equal(got[name], want[name]), name


def test_float32_close_to_float64():
    X = torch.randn(2, 32, 24, generator=torch.Generator().manual_seed(2))
    f32 = compute_metrics(X, "all")
    f64 = compute_metrics(X, "all", dtype=torch.float64)
    for name in METRICS:
        assert f32[name].dtype == torch.float32
        torch.testing.assert_close(f32[name].double(), f64[name], rtol=1e-4, atol=1e-4)


def test_numpy_float32_and_integer_inputs_accepted():
    X = np.arange(12).reshape(4, 3)
    got = compute_metrics(X, ("mu",))
    assert got["mu"].dtype == torch.get_default_dtype()
    assert float(got["mu"]) == pytest.approx(ref.mu(X.astype(float)), rel=1e-6)
