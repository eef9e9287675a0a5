"""participation_ratio: closed forms (uniform over k keys, one-hot, two keys), the
bounds 1 <= PR_i <= k_i and PR_i <= exp(H_i), a numpy reference, padding, the registry."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.errors import MetricError
from rankcollapse.metrics import ATTENTION_METRICS, compute_metrics, participation_ratio
from rankcollapse.metrics.attention import row_participation


def _softmax(S):
    E = np.exp(S - S.max(-1, keepdims=True))
    return E / E.sum(-1, keepdims=True)


def test_closed_forms_uniform_one_hot_two_keys():
    N = 5
    causal = torch.tril(torch.ones(N, N, dtype=torch.bool))
    A = causal.double() / causal.sum(-1, keepdim=True)  # row i uniform over its i + 1 keys
    rows = participation_ratio(A, causal, summary="rows")
    assert torch.allclose(rows, torch.arange(1, N + 1, dtype=torch.float64), rtol=1e-12)
    assert float(participation_ratio(A, causal)) == pytest.approx(3.0, rel=1e-12)  # mean of 1..5
    assert float(participation_ratio(A, causal, summary="max")) == pytest.approx(5.0, rel=1e-12)
    assert float(participation_ratio(A, causal, summary="median")) == pytest.approx(3.0, rel=1e-12)
    assert torch.allclose(participation_ratio(torch.eye(4, dtype=torch.float64), summary="rows"),
                          torch.ones(4, dtype=torch.float64))
    p = 0.8  # (p, 1 - p): 1 / (p^2 + (1 - p)^2) = 1 / 0.68
    A2 = torch.tensor([[p, 1 - p], [0.5, 0.5]], dtype=torch.float64)
    assert participation_ratio(A2, summary="rows").tolist() == pytest.approx([1 / 0.68, 2.0], rel=1e-12)


def test_reference_bounds_and_shapes():
    rng = np.random.default_rng(0)
    A = _softmax(rng.normal(scale=3.0, size=(2, 3, 7, 7)))  # (B, H, N, N)
    rows = participation_ratio(torch.from_numpy(A), summary="rows")
    ref = 1.0 / (A ** 2).sum(-1)
    assert rows.shape == (2, 3, 7)
    np.testing.assert_allclose(rows.numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(participation_ratio(A).numpy(), ref.reshape(2, -1).mean(-1), rtol=1e-12)
    np.testing.assert_allclose(participation_ratio(A, summary="max").numpy(), ref.reshape(2, -1).max(-1), rtol=1e-12)
    H = -(A * np.log(A)).sum(-1)
    assert (ref >= 1 - 1e-12).all() and (ref <= 7 + 1e-12).all() and (ref <= np.exp(H) * (1 + 1e-12)).all()
    assert participation_ratio(A[0, 0], summary="rows").shape == (7,)
    assert participation_ratio(A[:, 0], summary="rows").shape == (2, 7)
    assert participation_ratio(A[0, 0]).ndim == 0


def test_padding_leaves_padded_queries_and_keys_out():
    pad = torch.tensor([[True, True, True, False], [True, True, False, False]])
    A = torch.zeros(2, 4, 4, dtype=torch.float64)
    A[0, :3, :3] = 1 / 3  # sample 0: three real tokens, uniform
    A[1, :2, 0] = 1.0  # sample 1: one-hot on key 0
    A[0, 3, 3] = A[1, 2:, 3] = 1.0  # padded queries' rows: not read
    assert participation_ratio(A, padding_mask=pad).tolist() == pytest.approx([3.0, 1.0], rel=1e-12)
    rows = participation_ratio(A, padding_mask=pad, summary="rows")
    assert bool(torch.isnan(rows[0, 3])) and bool(torch.isnan(rows[1, 2:]).all())


def test_registry_and_compute_metrics():
    for name in ("participation_ratio", "participation_ratio_median", "participation_ratio_max"):
        assert ATTENTION_METRICS[name].uses_mask
    X = torch.randn(3, 2, dtype=torch.float64)
    out = compute_metrics(X, ["participation_ratio", "participation_ratio_max"],
                          attention=torch.full((3, 3), 1 / 3, dtype=torch.float64))
    assert float(out["participation_ratio"]) == pytest.approx(3.0) and float(out["participation_ratio_max"]) == pytest.approx(3.0)


def test_refusals():
    with pytest.raises(MetricError, match="summary"):
        participation_ratio(torch.eye(2), summary="min")
    with pytest.raises(MetricError, match="sum to 1"):
        participation_ratio(torch.full((2, 2), 0.25))
    with pytest.raises(MetricError, match="does not allow"):
        participation_ratio(torch.full((2, 2), 0.5), torch.eye(2, dtype=torch.bool))
    with pytest.raises(MetricError, match="no real query"):
        participation_ratio(torch.eye(2), padding_mask=torch.tensor([False, False]))


def test_row_participation_matches_formula_in_float32():
    a = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float32)
    assert float(row_participation(a)) == pytest.approx(1 / 0.375, rel=1e-6)
    assert math.isclose(float(row_participation(torch.ones(8, dtype=torch.float64) / 8)), 8.0, rel_tol=1e-12)
