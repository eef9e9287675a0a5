"""Padding: a padded sample gives exactly the metrics of its real rows."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from rankcollapse.metrics import METRICS, compute_metrics

from metrics_numpy_reference import names_at_rank
from rankcollapse.metrics._context import _groups


def _padded_batch(seed: int, B: int, N: int, d: int):
    rng = np.random.default_rng(seed)
    X = torch.from_numpy(rng.standard_normal((B, N, d)))
    pm = torch.from_numpy(rng.random((B, N)) < 0.6)
    pm[torch.arange(B), torch.from_numpy(rng.integers(0, N, B))] = True  # >= 1 real token
    junk = rng.choice([np.nan, 1e30, 0.0], size=(int((~pm).sum()), 1))
    X[~pm] = torch.from_numpy(junk)  # padded rows hold garbage that must be ignored
    return X, pm


@given(st.integers(1, 5), st.integers(1, 10), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_padded_batch_equals_unpadded_rows(B, N, d, seed):
    X, pm = _padded_batch(seed, B, N, d)
    names = names_at_rank(1, METRICS)  # a sample may keep one real token
    got = compute_metrics(X, names, padding_mask=pm)
    for b in range(B):
        alone = compute_metrics(X[b][pm[b]], names)
        for name in names:
            torch.testing.assert_close(got[name][b], alone[name], rtol=1e-12, atol=1e-12)


@given(st.integers(2, 10), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_graph_mask_is_restricted_to_real_tokens(N, d, seed):
    X, pm = _padded_batch(seed, 3, N, d)
    M = torch.from_numpy(np.random.default_rng(seed + 1).random((N, N)) < 0.5)
    names = ("dirichlet_energy", "mean_average_distance")
    got = compute_metrics(X, names, padding_mask=pm, mask=M)
    for b in range(3):
        keep = pm[b]
        alone = compute_metrics(X[b][keep], names, mask=M[keep][:, keep])
        for name in names:
            torch.testing.assert_close(got[name][b], alone[name], rtol=1e-12, atol=1e-12)


def test_left_and_right_padding_agree_and_equal_lengths_form_one_group():
    X = torch.randn(4, 9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    right = torch.arange(9).expand(4, 9) < 6
    left = torch.arange(9).expand(4, 9) >= 3
    X_left = torch.roll(X, shifts=3, dims=1)
    a = compute_metrics(X, "all", padding_mask=right)
    b = compute_metrics(X_left, "all", padding_mask=left)
    # the real tokens alone, laid out as the padding path gathers them (contiguous): the
    # same operations on the same layout, so the same bits; a strided view of them may be
    # reduced in another order (to round-off)
    c = compute_metrics(X[:, :6].contiguous(), "all")
    view = compute_metrics(X[:, :6], "all")
    for name in METRICS:
        assert torch.equal(a[name], b[name]) and torch.equal(a[name], c[name]), name
        torch.testing.assert_close(view[name], a[name], rtol=64 * torch.finfo(torch.float64).eps, atol=1e-14)
    groups = list(_groups(X, right, None))
    assert len(groups) == 1 and groups[0][1].shape == (4, 6, 5)


def test_integer_attention_mask_and_unbatched_padding():
    X = torch.randn(7, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    pm = torch.tensor([1, 1, 1, 1, 1, 0, 0])
    got = compute_metrics(X, "all", padding_mask=pm)
    want = compute_metrics(X[:5], "all")
    assert all(torch.equal(got[k], want[k]) for k in METRICS)
    assert all(v.ndim == 0 for v in got.values())


def test_rank_fraction_uses_real_token_count():
    # 3 real orthonormal tokens in d = 8 padded to N = 10: min(N, d) must be 3, not 8.
    X = torch.zeros(1, 10, 8, dtype=torch.float64)
    X[0, :3] = torch.eye(8, dtype=torch.float64)[:3]
    pm = torch.zeros(1, 10, dtype=torch.bool)
    pm[0, :3] = True
    got = compute_metrics(X, ("rank_fraction", "mu"), padding_mask=pm)
    assert float(got["rank_fraction"][0]) == 1.0
    assert float(got["mu"][0]) == np.sqrt(2.0)  # sqrt(N - 1) for an orthonormal frame
