"""Metastable clusters: the fastest linear mode, plateau detection, the cluster count
against an independent union-find, and a short circle run through ``simulate``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import iv

from rankcollapse.errors import ConfigError, MetricError
from rankcollapse.metrics import cluster_count, compute_metrics
from rankcollapse.theory.clusters import circle_clusters, fastest_mode, first_plateau, plateaus


@pytest.mark.parametrize("beta, k", [(0.5, 1), (2.0, 2), (4.0, 3), (9.0, 4), (16.0, 6)])
def test_fastest_mode_against_unscaled_bessel(beta, k):
    ks = np.arange(1, 30)
    assert fastest_mode(beta) == k == int(ks[np.argmax(ks**2 * iv(ks, beta))])


def test_fastest_mode_refuses_a_maximum_at_the_edge():
    with pytest.raises(ConfigError, match="raise k_max"):
        fastest_mode(400.0, k_max=5)


def test_plateaus_run_length():
    counts = [9, 7, 3, 3, 3, 2, 2, 2, 2]
    assert plateaus(counts) == [(9, 0, 1), (7, 1, 1), (3, 2, 3), (2, 5, 4)]
    assert first_plateau(counts, 3) == (3, 2, 3)
    assert first_plateau(counts, 5) is None


def _on_circle(angles):
    a = torch.tensor(angles, dtype=torch.float64)
    return torch.stack([a.cos(), a.sin()], -1)


def test_cluster_count_hand_built():
    # three tight groups 120 degrees apart, plus a chain 0.06 rad steps (one cluster by single linkage)
    X = _on_circle([0.0, 0.01, 2.1, 2.12, 4.2, 4.19])
    assert float(cluster_count(X)) == 3
    chain = _on_circle([0.0, 0.06, 0.12, 0.18])
    assert float(cluster_count(chain)) == 1 and float(cluster_count(chain, angle=0.05)) == 4
    Z = torch.cat([X, torch.zeros(1, 2, dtype=torch.float64)])  # a zero token is left out
    assert float(compute_metrics(Z, ["n_clusters"])["n_clusters"]) == 3
    with pytest.raises(MetricError):
        cluster_count(torch.zeros(3, 2))
    with pytest.raises(MetricError):
        cluster_count(X, angle=4.0)


def test_circle_flow_small_beta_is_one_cluster_and_run_is_reproducible():
    """beta = 0.5: the fastest mode is k = 1 (one cluster); the flow ends in one cluster."""
    r = circle_clusters(0.5, n_tokens=24, n_samples=3, depth=400, min_plateau=50)
    assert r.predicted == 1 and r.counts.shape == (401, 3)
    assert (r.counts[-1] == 1).all() and r.agreement == 1.0
    again = circle_clusters(0.5, n_tokens=24, n_samples=3, depth=400, min_plateau=50)
    assert np.array_equal(r.counts, again.counts)


def test_circle_step_is_the_projected_euler_step():
    """One layer of the simulate-based flow equals x + h A x normalised, from numpy."""
    import rankcollapse.theory.clusters as C
    from rankcollapse.dynamics import BlockConfig, RunConfig, simulate

    beta, h = 3.0, 0.1
    X0 = _on_circle(np.random.default_rng(0).uniform(0, 2 * math.pi, 10))
    eye = torch.eye(2, dtype=torch.float64)
    res = simulate(X0, mask="complete", d_qk=1 / beta**2, value=eye, query_key=eye,
                   block=BlockConfig(norm="sphere", placement="post_ln", alpha=1 / h),
                   run=RunConfig(depth=1, dtype=torch.float64, record_states=True))
    x = X0.numpy()
    W = np.exp(beta * x @ x.T)
    W /= W.sum(1, keepdims=True)
    y = x + h * W @ x
    np.testing.assert_allclose(res.states[1][0].numpy(), y / np.linalg.norm(y, axis=1, keepdims=True), rtol=1e-12)
    assert C.MIN_PLATEAU == 100


def test_cli_clusters_json():
    from tests.cli._harness import run_cli

    p = run_cli("theory", "clusters", "--beta", "0.5", "--n-tokens", "16", "--n-samples", "2", "--depth", "300",
                "--min-plateau", "50", "--format", "json")
    assert p.returncode == 0, p.stderr
    import json

    (res,) = json.loads(p.stdout)["results"]
    assert res["predicted"] == 1 and res["plateau_counts"] == [1, 1] and res["agreement"] == 1.0
    bad = run_cli("theory", "clusters", "--beta", "x")
    assert bad.returncode == 2 and "--beta" in bad.stderr and "Traceback" not in bad.stderr


def test_agreement_counts_starts_without_a_plateau_and_plateau_bounds():
    from rankcollapse.theory.clusters import CircleClusters

    r = CircleClusters(beta=2.0, predicted=2, counts=np.zeros((3, 2)), first=[None, (2, 0, 3)])
    assert r.plateau_counts == [-1, 2] and r.n_plateaus == 1 and r.agreement == 0.5
    assert "counts=array" not in repr(r) and "counts=" not in repr(r).replace("plateau_counts=", "")
    for bad in (0, 402):
        with pytest.raises(ConfigError, match="min_plateau"):
            circle_clusters(0.5, n_tokens=8, n_samples=1, depth=400, min_plateau=bad)
