"""The default numerical-rank tolerance uses the eps of the input's dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankcollapse import metrics as M


def _collapsed(dtype=torch.float32) -> torch.Tensor:
    """16 tokens in R^8, all equal to ones plus 1e-7 noise: rank one up to rounding."""
    g = torch.Generator().manual_seed(0)
    return (torch.ones(16, 8, dtype=torch.float64) + 1e-7 * torch.randn(16, 8, generator=g, dtype=torch.float64)).to(
        dtype
    )


@pytest.mark.parametrize("compute", [None, torch.float32, torch.float64])
def test_float32_data_keeps_float32_eps_whatever_the_compute_dtype(compute):
    X = _collapsed(torch.float32)
    assert float(M.rank_fraction(X, dtype=compute)) == 1 / 8
    got = M.compute_metrics(X, ("numerical_rank",), dtype=compute)
    assert float(got["numerical_rank"]) == 1.0


def test_matches_numpy_matrix_rank_on_the_input_dtype():
    X = _collapsed(torch.float32)
    expected = np.linalg.matrix_rank(X.numpy())  # numpy: eps of the array's own dtype
    assert float(M.numerical_rank(X, dtype=torch.float64)) == expected == 1
    Xn = X.numpy()
    assert float(M.numerical_rank(Xn, dtype=torch.float64)) == 1  # numpy float32 input too


def test_float64_data_uses_float64_eps():
    X = _collapsed(torch.float64)  # the 1e-7 noise is real data in float64
    assert float(M.numerical_rank(X)) == 8 == np.linalg.matrix_rank(X.numpy())


def test_float64_data_computed_in_float32_uses_the_coarser_eps():
    X = _collapsed(torch.float64)
    assert float(M.numerical_rank(X, dtype=torch.float32)) == 1


def test_float32_default_is_overridable_with_rtol():
    X = _collapsed(torch.float32)
    assert float(M.numerical_rank(X, dtype=torch.float64, rtol=16 * 2.2e-16)) == 8
    got = M.compute_metrics(X, ("rank_fraction",), dtype=torch.float64, rank_rtol=16 * 2.2e-16)
    assert float(got["rank_fraction"]) == 1.0


def test_batched_and_padded_inputs_use_the_input_eps():
    X = torch.stack([_collapsed(torch.float32), torch.randn(16, 8, generator=torch.Generator().manual_seed(1))])
    pm = torch.ones(2, 16, dtype=torch.bool)
    pm[1, 12:] = False
    got = M.numerical_rank(X, padding_mask=pm, dtype=torch.float64)
    assert got.tolist() == [1.0, 8.0]
