"""token_radius (a registry metric of one state) and angular_speed (a step metric of two
consecutive states, computed by simulate's layer loop) against numpy float64."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.errors import ConfigError, MetricError
from rankcollapse.metrics import METRICS, STEP_METRICS, angular_speed, compute_metrics


def test_token_radius_is_the_mean_token_norm():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 7, 5)) * np.array([1e-30, 1.0, 1e30])[:, None, None]
    got = compute_metrics(torch.from_numpy(X), ["token_radius"])["token_radius"].numpy()
    np.testing.assert_allclose(got, np.linalg.norm(X, axis=-1).mean(-1), rtol=1e-14)
    padded = compute_metrics(torch.from_numpy(X), ["token_radius"],
                             padding_mask=torch.tensor([[True] * 4 + [False] * 3] * 3))["token_radius"].numpy()
    np.testing.assert_allclose(padded, np.linalg.norm(X[:, :4], axis=-1).mean(-1), rtol=1e-14)
    assert float(compute_metrics(torch.tensor([[3.0, 4.0], [0.0, 1.0]]), ["token_radius"])["token_radius"]) == 3.0
    assert "token_radius" in METRICS


def test_angular_speed_hand_cases_and_numpy():
    X = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=torch.float64)
    Y = torch.tensor([[0.0, 5.0], [0.0, -1.0], [3.0, 3.0]], dtype=torch.float64)  # pi/2, pi, 0
    assert float(angular_speed(X, Y)) == pytest.approx(math.pi / 2, rel=1e-15)
    eps = 1e-9  # arccos(cos) would give 0 or 1.5e-8 here: the chord form keeps the digits
    Z = torch.tensor([[math.cos(eps), math.sin(eps)]] * 3, dtype=torch.float64)
    W = torch.tensor([[1.0, 0.0]] * 3, dtype=torch.float64)
    assert float(angular_speed(W, Z)) == pytest.approx(eps, rel=1e-12)
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((2, 4, 6, 3))
    cos = (A * B).sum(-1) / np.linalg.norm(A, axis=-1) / np.linalg.norm(B, axis=-1)
    np.testing.assert_allclose(angular_speed(torch.from_numpy(A), torch.from_numpy(B)).numpy(),
                               np.arccos(cos).mean(-1), rtol=1e-10)
    X[1] = 0.0
    assert math.isnan(float(angular_speed(X, Y)))  # a zero token has no direction
    with pytest.raises(MetricError, match="one shape"):
        angular_speed(X, Y[:2])


def test_step_metric_is_refused_by_compute_metrics():
    assert "angular_speed" in STEP_METRICS and "angular_speed" not in METRICS
    with pytest.raises(MetricError, match="two consecutive states"):
        compute_metrics(torch.ones(3, 2), ["angular_speed"])


def test_simulate_records_both_per_layer():
    X0 = torch.randn(2, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    res = simulate(X0, mask="causal", metrics=["mu", "angular_speed", "token_radius"], block="post_ln",
                   run=RunConfig(depth=4, dtype=torch.float64, record_states=True))
    assert list(res.metrics) == ["mu", "angular_speed", "token_radius"]
    assert torch.isnan(res.metrics["angular_speed"][0]).all()
    for t in range(1, 5):
        S0, S1 = (s.numpy() for s in (res.states[t - 1], res.states[t]))
        cos = (S0 * S1).sum(-1) / np.linalg.norm(S0, axis=-1) / np.linalg.norm(S1, axis=-1)
        np.testing.assert_allclose(res.metrics["angular_speed"][t].numpy(), np.arccos(cos).mean(-1), rtol=1e-9)
        np.testing.assert_allclose(res.metrics["token_radius"][t].numpy(), np.linalg.norm(S1, axis=-1).mean(-1),
                                   rtol=1e-13)
    with pytest.raises(ConfigError, match="unknown metrics"):
        simulate(X0, mask="causal", metrics=["angular_sped"], run=RunConfig(depth=1))
