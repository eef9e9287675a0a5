"""Bad input: a clear MetricError naming the problem."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rankcollapse import metrics as M
from rankcollapse.errors import MetricError, RankCollapseError


@pytest.mark.parametrize(
    "X,match",
    [
        (torch.zeros(0, 4), "empty"),
        (torch.zeros(3, 0), "empty"),
        (torch.zeros(0, 3, 4), "empty"),
        (torch.ones(5), "shape \\(N, d\\) or \\(B, N, d\\)"),
        (torch.ones(2, 2, 2, 2), "4 dimension"),
        (torch.ones(2, 2, dtype=torch.complex64), "complex"),
        ([[1.0, 2.0]], "torch.Tensor or numpy array"),
    ],
)
def test_bad_arrays(X, match):
    with pytest.raises(MetricError, match=match):
        M.compute_metrics(X)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_name_the_samples(bad):
    X = torch.randn(4, 5, 3)
    X[2, 1, 0] = bad
    with pytest.raises(MetricError, match=r"NaN or Inf in samples \[2\]"):
        M.compute_metrics(X)
    with pytest.raises(MetricError, match="NaN or Inf in X"):
        M.mu(X[2])
    pm = torch.ones(4, 5, dtype=torch.bool)
    pm[2, 1] = False  # the bad value sits on a padded row: ignored
    assert all(torch.isfinite(v).all() for v in M.compute_metrics(X, padding_mask=pm).values())


def test_padding_mask_errors():
    X = torch.randn(3, 4, 2)
    with pytest.raises(MetricError, match=r"removes every token of samples \[1\]"):
        M.compute_metrics(X, padding_mask=torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]))
    with pytest.raises(MetricError, match=r"shape \(3, 4\)"):
        M.compute_metrics(X, padding_mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(MetricError, match="boolean"):
        M.compute_metrics(X, padding_mask=torch.full((3, 4), 0.5))
    with pytest.raises(MetricError, match="removes every token of the input"):
        M.mu(X[0], padding_mask=torch.zeros(4, dtype=torch.bool))


def test_graph_mask_errors():
    X = torch.randn(2, 4, 3)
    with pytest.raises(MetricError, match="boolean"):
        M.dirichlet_energy(X, mask=torch.ones(4, 4))
    with pytest.raises(MetricError, match=r"shape \(4, 4\)"):
        M.dirichlet_energy(X, mask=torch.ones(5, 5, dtype=torch.bool))


def test_unknown_or_empty_names_and_bad_dtype():
    with pytest.raises(MetricError, match=r"unknown metric\(s\) \['nope'\]; available: mu,"):
        M.compute_metrics(torch.randn(3, 2), ("mu", "nope"))
    with pytest.raises(MetricError, match="no metric names"):
        M.compute_metrics(torch.randn(3, 2), ())
    with pytest.raises(MetricError, match="floating"):
        M.compute_metrics(torch.randn(3, 2), dtype=torch.int64)


def test_undefined_values_raise_and_name_the_sample():
    X = torch.randn(3, 4, 2)
    X[1] = 0.0
    with pytest.raises(MetricError, match=r"zero matrix.*samples \[1\]"):
        M.compute_metrics(X, ("stable_rank",))
    got = M.compute_metrics(X, ("mu", "rank_fraction", "sigma_min"))  # defined on zero
    assert float(got["mu"][1]) == 0.0 and float(got["rank_fraction"][1]) == 0.0


def test_errors_are_value_errors():
    assert issubclass(MetricError, RankCollapseError) and issubclass(MetricError, ValueError)
    with pytest.raises(ValueError):
        M.mu(np.zeros((0, 2)))


@pytest.mark.parametrize("X", [np.array([["a", "b"], ["c", "d"]]), np.array([[1, 2], [3, 4]], dtype=object),
                               np.array([["2020-01-01"] * 2] * 2, dtype="datetime64[D]")])
def test_non_numeric_numpy_arrays_are_refused(X):
    """Strings, objects and dates have no metric: a MetricError naming the dtype (not
    torch's TypeError)."""
    with pytest.raises(MetricError, match="must hold numbers"):
        M.compute_metrics(X)


@pytest.mark.parametrize("dtype", [">f8", ">f4", ">i4", "<f8"])
def test_either_byte_order_gives_the_native_values(dtype):
    """Big-endian arrays (a file from another machine) are valid data: the metrics equal
    those of the same values in native order."""
    rng = np.random.default_rng(0)
    values = rng.normal(size=(2, 6, 4)) if dtype[1] == "f" else rng.integers(1, 10, size=(2, 6, 4))
    native = values.astype(np.dtype(dtype).newbyteorder("="))
    X = native.astype(dtype)
    got, want = M.compute_metrics(X, "all"), M.compute_metrics(native, "all")
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("call", [
    lambda: M.cluster_count(None), lambda: M.cluster_count([["a", "b"]]),
    lambda: M.angular_speed(None, None), lambda: M.composite_norm(None),
], ids=["cluster_count-None", "cluster_count-strings", "angular_speed-None", "composite_norm-None"])
def test_a_wrong_argument_type_is_a_metric_error(call):
    with pytest.raises(MetricError):
        call()
