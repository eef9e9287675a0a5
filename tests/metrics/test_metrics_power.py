"""v1_alignment: tokens against the principal eigenvector of a layer's W_O W_V (metrics/power.py),
on hand-built value matrices with known eigenvectors, against numpy.linalg.eig, and as
simulate records it (WEIGHT_METRICS)."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import BlockConfig, LayerWeights, RunConfig, simulate
from rankcollapse.errors import MetricError
from rankcollapse.metrics import WEIGHT_METRICS, compute_metrics
from rankcollapse.metrics.power import (
    principal_eigenvector, random_alignment, spectral_radius, v1_alignment, value_output_map,
)

T = dict(dtype=torch.float64)


def _basis(d: int, seed: int = 0) -> torch.Tensor:
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed), **T))
    return Q


def test_aligned_and_orthogonal_tokens():
    """W_V = diag(3, 1, 0.5): v1 = e_1; tokens on e_1 read 1, tokens orthogonal to it 0,
    a token at 60 degrees cos 60 = 1/2."""
    W = torch.diag(torch.tensor([3.0, 1.0, 0.5], **T))
    v1, ratio = principal_eigenvector(W)
    torch.testing.assert_close(v1, torch.tensor([[1.0, 0.0, 0.0]], **T))
    assert ratio == pytest.approx(1 / 3, rel=1e-14)
    on = torch.tensor([[2.0, 0.0, 0.0], [-5.0, 0.0, 0.0]], **T)
    off = torch.tensor([[0.0, 1.0, 0.0], [0.0, -2.0, 7.0]], **T)
    sixty = torch.tensor([[0.5, math.sqrt(3) / 2, 0.0]], **T)
    assert float(v1_alignment(on, v1)) == 1.0
    assert float(v1_alignment(off, v1)) == 0.0
    assert float(v1_alignment(sixty, v1)) == pytest.approx(0.5, rel=1e-15)
    batch = v1_alignment(torch.stack([on, off]), v1)
    torch.testing.assert_close(batch, torch.tensor([1.0, 0.0], **T))
    # padding leaves the off-line token of a mixed sample out
    mixed = torch.stack([torch.cat([on[:1], off[:1]])])
    assert float(v1_alignment(mixed, v1, padding_mask=torch.tensor([[True, False]]))[0]) == 1.0


def test_row_convention_reads_the_left_eigenvector():
    """x -> x M with M = [[2, 1], [0, 1]]: its left eigenvector for 2 (v M = 2 v) is (1, 1)/sqrt 2,
    its right one (M v = 2 v) is e_1; iterating x M converges to the left one."""
    M = torch.tensor([[2.0, 1.0], [0.0, 1.0]], **T)
    v1, ratio = principal_eigenvector(M)
    torch.testing.assert_close(v1, torch.tensor([[1.0, 1.0]], **T) / math.sqrt(2))
    assert ratio == pytest.approx(0.5, rel=1e-14)
    x = torch.tensor([0.3, -1.0], **T)
    for _ in range(60):
        x = x @ M
        x = x / torch.linalg.vector_norm(x)
    assert float(v1_alignment(x[None], v1)) == pytest.approx(1.0, abs=1e-12)


def test_against_numpy_eig():
    """A random non-symmetric M whose leading eigenvalue is real: v1 is numpy's eigenvector of
    M^T for the eigenvalue of largest modulus, the alignment numpy's mean |cos|."""
    rng = np.random.default_rng(3)
    d = 9
    P = rng.standard_normal((d, d))
    lam = np.array([-4.0, 2.5, 1.5, -1.0, 0.7, 0.5, 0.3, 0.2, 0.1])
    M = P @ np.diag(lam) @ np.linalg.inv(P)
    w, V = np.linalg.eig(M.T)
    k = np.argmax(np.abs(w))
    ref = np.real(V[:, k]) / np.linalg.norm(np.real(V[:, k]))
    v1, ratio = principal_eigenvector(torch.from_numpy(M))
    assert abs(float(v1[0] @ torch.from_numpy(ref))) == pytest.approx(1.0, abs=1e-10)
    assert ratio == pytest.approx(2.5 / 4.0, rel=1e-9)
    X = rng.standard_normal((3, 11, d))
    want = (np.abs(X @ ref) / np.linalg.norm(X, axis=-1)).mean(-1)
    np.testing.assert_allclose(v1_alignment(torch.from_numpy(X), v1).numpy(), want, rtol=1e-10)


def test_ties_and_complex_pairs():
    """lambda = +1 and -1 tie in modulus: v1 belongs to +1. A rotation block leading (a complex
    pair r e^{+-i theta}): v1 is the plane it turns in, and a token in that plane reads 1."""
    Q = _basis(4, seed=1)
    M = Q @ torch.diag(torch.tensor([-1.0, 1.0, 0.5, 0.2], **T)) @ Q.T
    v1, ratio = principal_eigenvector(M)
    assert abs(float(v1[0] @ Q[:, 1])) == pytest.approx(1.0, abs=1e-12) and ratio == pytest.approx(1.0, rel=1e-12)
    c, s = math.cos(0.3), math.sin(0.3)
    R = torch.tensor([[2 * c, -2 * s, 0.0], [2 * s, 2 * c, 0.0], [0.0, 0.0, 1.0]], **T)
    plane, ratio = principal_eigenvector(R)
    assert plane.shape == (2, 3) and ratio == pytest.approx(0.5, rel=1e-12)
    torch.testing.assert_close(plane @ plane.T, torch.eye(2, **T))
    torch.testing.assert_close(plane[:, 2], torch.zeros(2, **T))
    tokens = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 1.0]], **T)
    assert float(v1_alignment(tokens, plane)) == pytest.approx((1 + 0 + 1 / math.sqrt(2)) / 3, rel=1e-14)
    with pytest.raises(MetricError, match="every eigenvalue"):
        principal_eigenvector(torch.zeros(3, 3, **T))


def test_value_output_map_sums_the_heads():
    """M = W_V W_O = sum_h W_V^h W_O^h; grouped-query heads read their shared value head."""
    rng = np.random.default_rng(5)
    d, H, dv = 6, 2, 3
    W_V, W_O = rng.standard_normal((d, H * dv)), rng.standard_normal((H * dv, d))
    layer = LayerWeights(torch.zeros(d, H * dv), torch.zeros(d, H * dv), torch.from_numpy(W_V), torch.from_numpy(W_O),
                         n_heads=H)
    np.testing.assert_allclose(value_output_map(layer).numpy(), W_V @ W_O, rtol=1e-12)
    W_Vkv = rng.standard_normal((d, dv))  # one key/value head for both query heads
    gqa = LayerWeights(torch.zeros(d, H * dv), torch.zeros(d, dv), torch.from_numpy(W_Vkv), torch.from_numpy(W_O),
                       n_heads=H, n_kv_heads=1)
    np.testing.assert_allclose(value_output_map(gqa).numpy(), W_Vkv @ (W_O[:dv] + W_O[dv:]), rtol=1e-12)
    assert value_output_map(LayerWeights(torch.zeros(d, d), torch.zeros(d, d), torch.from_numpy(W_O[:d]))).shape == (d, d)


def test_spectral_radius_closed_forms():
    assert spectral_radius(torch.diag(torch.tensor([0.5, -3.0, 2.0]))) == pytest.approx(3.0, rel=1e-15)
    rotation = torch.tensor([[0.0, -2.0], [2.0, 0.0]])  # eigenvalues +-2i
    assert spectral_radius(rotation) == pytest.approx(2.0, rel=1e-12)


def test_random_alignment_closed_form():
    assert random_alignment(1) == pytest.approx(1.0, rel=1e-14)
    assert random_alignment(2) == pytest.approx(2 / math.pi, rel=1e-14)
    rng = np.random.default_rng(0)
    U = rng.standard_normal((200_000, 16))
    assert np.abs(U[:, 0] / np.linalg.norm(U, axis=1)).mean() == pytest.approx(random_alignment(16), rel=0.01)


def test_simulate_records_it_with_each_layers_weights():
    """Shared symmetric W_V with lambda_2 / lambda_1 = 0.5 on the sphere: the tokens end on v1's
    line; row t reads layer max(t, 1); compute_metrics refuses a weight metric."""
    d = 6
    Q = _basis(d, seed=2)
    W = Q @ torch.diag(torch.tensor([1.0, 0.5, 0.25, 0.25, 0.25, 0.25], **T)) @ Q.T
    X0 = torch.randn(3, 10, d, generator=torch.Generator().manual_seed(0), **T)
    res = simulate(X0, mask="complete", block=BlockConfig(norm="sphere"), run=RunConfig(depth=40, seed=0, dtype=torch.float64),
                   value=W, shared=True, metrics=["v1_alignment"])
    a = res.metrics["v1_alignment"]
    assert a.shape == (41, 3)
    torch.testing.assert_close(a[0], v1_alignment(X0, Q[:, 0]))
    assert bool((a[-1] > 1 - 1e-9).all())
    assert "v1_alignment" in WEIGHT_METRICS
    with pytest.raises(MetricError, match="a layer's weights"):
        compute_metrics(X0, ["v1_alignment"])
