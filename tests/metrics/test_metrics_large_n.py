"""Cosine statistics without the (N, N) matrix: the d-dimensional form of the signed
sum and the chunked |cos| sum equal the direct path and numpy float64."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import metrics_numpy_reference as ref
from rankcollapse.metrics import _context, compute_metrics

NAMES = ("avg_cos", "avg_abs_cos")


def _both(X, **kw):
    direct = compute_metrics(X, NAMES, **kw)
    budget = _context.PAIR_BUDGET
    _context.PAIR_BUDGET = 0  # force the d-dimensional and chunked forms
    try:
        large = compute_metrics(X, NAMES, **kw)
    finally:
        _context.PAIR_BUDGET = budget
    return direct, large


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.integers(0, 3), st.integers(0, 10**6))
def test_large_n_forms_equal_direct_and_numpy(n, d, n_zero, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) + rng.standard_normal(d)  # a shared direction: cosines far from 0
    X[: min(n_zero, n - 1)] = 0.0  # zero tokens are left out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        direct, large = _both(torch.as_tensor(X))
    for name in NAMES:
        expect = getattr(ref, name)(X)
        assert float(large[name]) == pytest.approx(expect, rel=1e-10, abs=1e-12)
        assert float(large[name]) == pytest.approx(float(direct[name]), rel=1e-10, abs=1e-12)


def test_padding_and_batches_float32():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(3, 50, 8, generator=g)
    pm = torch.ones(3, 50, dtype=torch.bool)
    pm[1, 30:] = False
    direct, large = _both(X, padding_mask=pm)
    for name in NAMES:
        torch.testing.assert_close(large[name], direct[name], rtol=1e-5, atol=1e-6)


def test_two_orthogonal_groups_closed_form():
    n = 6000  # (N, N) float32 would be 137 MiB > PAIR_BUDGET: the large-N forms run
    X = torch.zeros(n, 4)
    X[: n // 2, 0] = 1.0
    X[n // 2 :, 1] = -2.0
    got = compute_metrics(X, NAMES)
    same_group_pairs = 2 * (n // 2) * (n // 2 - 1)
    assert float(got["avg_abs_cos"]) == pytest.approx(same_group_pairs / (n * (n - 1)), rel=1e-6)
    assert float(got["avg_cos"]) == pytest.approx(same_group_pairs / (n * (n - 1)), rel=1e-6)
