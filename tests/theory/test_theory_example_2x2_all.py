"""The N = d = 2 example has exactly ten SA-LN equilibria (docs/theory.md §3a): checked
against a brute-force root search over token angles, independent of the closed form."""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq, minimize_scalar

from rankcollapse.theory.equilibria import causal_example_2x2

W_V = np.array([[1.0, -3.0], [0.0, 2.0]])


def _unit(theta):
    return np.array([np.cos(theta), np.sin(theta)])


def _fixed_angles(image) -> list[float]:
    """Angles θ with normalise(image(x)) = x for x = (cos θ, sin θ): zeros of the 2-D
    cross product det[x; image(x)] (sign changes and touching zeros), image · x > 0."""
    g = lambda t: float(np.linalg.det(np.stack([_unit(t), image(_unit(t))])))  # noqa: E731
    grid = np.linspace(-np.pi, np.pi, 20001)
    vals = np.array([g(t) for t in grid])
    crossing = np.sign(vals[:-1]) != np.sign(vals[1:])
    cand = np.nonzero(crossing | (np.abs(vals[:-1]) < 1e-3))[0]
    roots: list[float] = []
    for i in cand:
        if crossing[i]:
            t = brentq(g, grid[i], grid[i + 1], xtol=1e-15)
        else:  # a touching zero (double root) has no sign change
            t = minimize_scalar(lambda s: abs(g(s)), bounds=(grid[max(i - 1, 0)], grid[min(i + 2, 20000)]),
                                method="bounded", options={"xatol": 1e-14}).x
        x, y = _unit(t), image(_unit(t))
        if abs(g(t)) < 1e-9 and x @ y > 1e-9 and not any(abs(np.angle(np.exp(1j * (t - r)))) < 1e-5 for r in roots):
            roots.append(t)
    return roots


def _brute_force_equilibria() -> list[np.ndarray]:
    found = []
    for t0 in _fixed_angles(lambda x: x @ W_V):
        x0 = _unit(t0)
        for t1 in _fixed_angles(lambda x: (x0 + x) @ W_V):
            found.append(np.stack([x0, _unit(t1)]))
    return found


def test_closed_form_lists_every_equilibrium_with_rank_and_stability():
    es = causal_example_2x2().with_stability()
    closed = [e.X.numpy() for e in es.equilibria]
    brute = _brute_force_equilibria()
    assert len(closed) == len(brute) == 10
    for X in brute:
        assert min(np.abs(X - C).max() for C in closed) < 1e-6
    by_label = {label: e for label, e in zip(es.info["labels"], es.equilibria)}
    expected = {  # label: (rank, stable, tangent-eigenvalue moduli)
        "[(0,1), B]": (2, True, [0.5, 0.13030615433]),
        "[(0,1), B']": (2, False, [0.5, 3.06969384567]),
        "[(0,1), (0,1)]": (1, True, [0.25, 0.5]),
        "[(1,3), (1,3)]/√10": (1, False, [1.0, 2.0]),
        "[(1,3), (1,-3)]/√10": (2, False, [0.1, 2.0]),
    }
    for sign in "+-":
        for label, (rank, stable, mods) in expected.items():
            e = by_label[sign + label]
            got = sorted(abs(complex(*d["eigenvalue"])) for d in e.stability.to_dict()["directions"])
            assert e.rank == rank and e.stable is stable and e.residual < 1e-14
            np.testing.assert_allclose(got, sorted(mods), atol=1e-9)
    assert sum(e.rank == 2 for e in es.equilibria) == 6
    assert sum(e.rank == 2 and e.stable for e in es.equilibria) == 2
