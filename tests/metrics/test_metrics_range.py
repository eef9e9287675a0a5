"""Norm-based metrics of float32 tokens far outside the squared range stay finite and exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankcollapse.metrics import compute_metrics
from rankcollapse.metrics._context import stable_norm

NORM_METRICS = ("mu", "mu_relative", "rank_one_distance", "cos_to_mean")


def _reference(X: torch.Tensor) -> dict[str, np.ndarray]:
    """float64 numpy values; the scales used below keep float64 squares in range."""
    x = X.double().numpy()
    c = x - x.mean(-2, keepdims=True)
    mu = np.linalg.norm(c, axis=(-2, -1))
    s = np.linalg.svd(x, compute_uv=False)
    m = x.mean(-2)
    cos = (x @ m[..., None])[..., 0] / np.linalg.norm(x, axis=-1) / np.linalg.norm(m, axis=-1)[..., None]
    return {"mu": mu, "mu_relative": mu / np.linalg.norm(x, axis=(-2, -1)),
            "rank_one_distance": np.linalg.norm(s[..., 1:], axis=-1), "cos_to_mean": cos.mean(-1)}


@pytest.mark.parametrize("scale", [1e25, 1e34, 1e-25, 1e-40])
def test_float32_norm_metrics_do_not_overflow_or_vanish(scale):
    base = torch.randn(3, 6, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    X = (base * scale).float()  # finite float32; plain float32 squares are inf (or 0)
    if scale > 1:
        assert not bool(torch.isfinite(torch.linalg.vector_norm(X, dim=(-2, -1))).all())
    else:
        assert bool((torch.linalg.vector_norm(X, dim=(-2, -1)) < 0.5 * scale * 5).all())
    # subnormal tokens (1e-40): 1/||x|| overflows, so cosines are out of reach there
    names = NORM_METRICS if scale > 1e-38 else NORM_METRICS[:3]
    got = compute_metrics(X, names)
    ref = _reference(X)
    for name in names:
        assert bool(torch.isfinite(got[name]).all()), name
        np.testing.assert_allclose(got[name].double().numpy(), ref[name], rtol=2e-5, err_msg=name)


def test_mixed_scales_in_one_batch_are_each_exact():
    base = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    X = (base * torch.tensor([1e30, 1.0, 1e-30], dtype=torch.float64)[:, None, None]).float()
    got = compute_metrics(X, ("mu", "mu_relative"))
    ref = _reference(X)
    np.testing.assert_allclose(got["mu"].double().numpy(), ref["mu"], rtol=2e-5)
    np.testing.assert_allclose(got["mu_relative"].double().numpy(), ref["mu_relative"], rtol=2e-5)


def test_stable_norm_matches_plain_norm_and_keeps_zeros():
    Y = torch.tensor([[3.0, 4.0], [0.0, 0.0], [3e30, 4e30], [3e-30, -4e-30]])
    torch.testing.assert_close(stable_norm(Y, -1), torch.tensor([5.0, 0.0, 5e30, 5e-30]))
    assert float(stable_norm(Y[:2], (-2, -1))) == 5.0
