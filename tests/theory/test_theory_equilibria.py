"""Equilibria of SA-LN: the 2x2 example in closed form, the rank-k construction, stability."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.errors import ConfigError, ConvergenceError
from rankcollapse.theory.equilibria import causal_example_2x2, equilibria
from rankcollapse.theory.equilibria import find_equilibria
from rankcollapse.theory.stability import jacobian, stability
from rankcollapse.theory.system import AttentionSystem, causal_uniform_system


def test_2x2_example_closed_form_and_stability():
    es = causal_example_2x2().with_stability()
    B = np.array([(6 - math.sqrt(6)) / 10, -(2 + 3 * math.sqrt(6)) / 10])
    first = es.equilibria[0]
    np.testing.assert_allclose(first.X.numpy(), [[0, 1], B], atol=1e-15)
    assert first.rank == 2 and first.stable and first.residual < 1e-14
    # token 1's tangent eigenvalue: x_perp W_V x_perp^T / alpha with alpha = 1
    x_perp = np.array([-B[1], B[0]])
    expected = x_perp @ np.array([[1, -3], [0, 2]]) @ x_perp
    mods = sorted(abs(complex(*d["eigenvalue"])) for d in first.stability.to_dict()["directions"])
    np.testing.assert_allclose(mods, sorted([abs(expected), 0.5]), atol=1e-12)  # token 0: λ2/λ1 = 1/2
    ranks = [e.rank for e in es.equilibria]
    assert ranks.count(2) == 6 and len({tuple(e.X.flatten().tolist()) for e in es.equilibria}) == 10
    assert [e.stable for e in es.equilibria[:4]] == [True, False, True, False]


@pytest.mark.parametrize("n,d,k", [(2, 2, 2), (6, 4, 3), (3, 5, 3), (5, 5, 1), (7, 3, 2), (5, 5, 5)])
def test_construction_has_2k_distinct_rank_k_fixed_points(n, d, k, numpy_step):
    es = equilibria(n, d, k)
    obj = es.to_dict()
    Xs = [np.array(e["X"]) for e in obj["equilibria"]]
    assert len(Xs) >= 2**k
    assert len({tuple(np.round(X, 12).flatten()) for X in Xs}) == len(Xs)
    for X in Xs:
        assert np.linalg.matrix_rank(X, tol=1e-8) == k
        np.testing.assert_allclose(numpy_step(obj, X), X, atol=1e-10, rtol=0)
    # stability per direction: token t is unstable along the k-1-t larger eigen-directions
    assert all(e.stability.n_unstable == k * (k - 1) // 2 for e in es.equilibria)
    assert all(e.stable == (k == 1) for e in es.equilibria)


def test_construction_large_rank_stays_exact():
    es = equilibria(140, 130, 128, limit=2, stability=False)
    assert all(e.rank == 128 and e.residual <= 1e-10 for e in es.equilibria)


def test_autograd_jacobian_matches_finite_differences():
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    W = [torch.randn(2, 2, generator=g, dtype=torch.float64) for _ in range(3)]
    system = AttentionSystem(mask, W[0], W[1], W[2], 0.7)
    X = torch.nn.functional.normalize(torch.randn(3, 2, generator=g, dtype=torch.float64), dim=1)
    J = jacobian(system, X).numpy()
    h, fd = 1e-6, np.zeros_like(J)
    for m in range(X.numel()):
        E = torch.zeros(X.numel(), dtype=torch.float64)
        E[m] = h
        E = E.view_as(X)
        fd[:, m] = ((system.step(X + E) - system.step(X - E)) / (2 * h)).flatten().numpy()
    np.testing.assert_allclose(J, fd, atol=1e-7)


def test_bad_input_rank_and_zero_row():
    with pytest.raises(ConfigError, match="min\\(N, d\\)"):
        equilibria(2, 3, 3)
    zero = causal_uniform_system(torch.zeros(2, 2, dtype=torch.float64), 2)
    with pytest.raises(ConfigError, match="zero before normalisation"):
        zero.step(torch.eye(2, dtype=torch.float64))
    with pytest.raises(ConfigError, match="zero before normalisation"):
        stability(zero, torch.eye(2, dtype=torch.float64))


def test_finder_recovers_the_example_and_reports_failure():
    res = find_equilibria(causal_example_2x2().system, n_starts=200, seed=0)
    B = np.array([(6 - math.sqrt(6)) / 10, -(2 + 3 * math.sqrt(6)) / 10])
    hits = [e for e in res.equilibria if np.allclose(np.abs(e.X[1].numpy()), np.abs(B), atol=1e-8)]
    assert hits and all(e.rank == 2 and e.stable for e in hits)
    assert {np.sign(e.X[0, 1].item()) for e in hits} == {1.0, -1.0}
    assert all(e.residual <= 1e-10 for e in res.equilibria)
    with pytest.raises(ConvergenceError, match="tried 4 seeded starts"):
        find_equilibria(causal_example_2x2().system, n_starts=4, fixed_point_iters=1, newton_iters=0, tol=1e-300)


def test_finder_from_given_starts_finds_unstable_construction_points():
    es = equilibria(3, 3, 3, stability=False)
    starts = torch.stack([e.X for e in es.equilibria]) + 1e-4
    res = find_equilibria(es.system, starts=starts, n_starts=4, seed=1)
    rank3 = [e for e in res.equilibria if e.rank == 3]
    assert len(rank3) >= 8 and not any(e.stable for e in rank3)


def test_tangent_basis_batched_equals_per_sample_and_is_tangent():
    from rankcollapse.theory.stability import tangent_basis

    X = torch.nn.functional.normalize(torch.randn(5, 4, 3, dtype=torch.float64), dim=-1)
    Q = tangent_basis(X)  # (5, 12, 8)
    assert all(torch.equal(Q[b], tangent_basis(X[b])) for b in range(5))
    torch.testing.assert_close(Q.transpose(1, 2) @ Q, torch.eye(8, dtype=torch.float64).expand(5, 8, 8))
    assert float((X.reshape(5, 1, 12) @ Q).abs().max()) < 1e-14


def test_finder_from_given_starts_alone():
    """n_starts = 0 with starts: no random start is added (the old code refused it)."""
    es = equilibria(3, 3, 2, stability=False)
    starts = torch.stack([e.X for e in es.equilibria])
    res = find_equilibria(es.system, starts=starts, n_starts=0)
    assert res.n_starts == 4 and len(res.equilibria) == 4
    assert all(e.rank == 2 and not e.stable for e in res.equilibria)  # §3b: k(k-1)/2 = 1 unstable direction
    with pytest.raises(ConfigError):
        find_equilibria(es.system, n_starts=0)


def test_construction_stability_counts_match_theory_3b():
    """Every rank-k equilibrium of the construction has k(k-1)/2 unstable directions, so
    none is stable for k >= 2 (what the phase's equilibria prediction reads)."""
    for k in (1, 2, 3):
        es = equilibria(4, 4, k, limit=2)
        assert all(e.stability.n_unstable == k * (k - 1) // 2 for e in es.equilibria)
        assert all(bool(e.stable) == (k == 1) for e in es.equilibria)
