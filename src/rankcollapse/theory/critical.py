"""Critical attention scaling ``β = γ log N`` (Chen, Lin, Polyanskiy & Rigollet, ICLR 2026): the
paper's ``γ_c = 1 / (1 - ρ)``, a finite-``d`` estimate (:func:`annealed_gamma`, derived here: a
token's own weight is one half on average, ``e^β = (N - 1) e^{βρ} M_{d-1}((1 - ρ) β)``,
``M_k(b) = Γ(k/2) (2/b)^{k/2-1} I_{k/2-1}(b)``) and the measured switch (:func:`switch`).
"""

from __future__ import annotations

import math

import numpy as np

#: the switch level and the two levels of the transition width
SWITCH_LEVEL = 0.5
WIDTH_LEVELS = (0.1, 0.9)


def paper_gamma(rho: float) -> float:
    """``γ_c = 1 / (1 - ρ)`` (Chen et al., ICLR 2026, almost-simplex tokens, d -> infinity)."""
    return 1.0 / (1.0 - rho)


def _log_mgf(b: float, k: int) -> float:
    """``log M_k(b)``, ``M_k(b) = E exp(b u_1)`` for ``u`` uniform on ``S^{k-1}`` (``b > 0``)."""
    from scipy.special import gammaln, hyp0f1, ive

    nu = k / 2 - 1
    scaled = ive(nu, b)
    if scaled > 0:  # M_k(b) = Γ(ν+1) (2/b)^ν I_ν(b), I_ν = ive e^b
        return float(gammaln(nu + 1) + nu * math.log(2 / b) + math.log(scaled) + b)
    return float(math.log(hyp0f1(k / 2, b * b / 4)))  # the same series, 0F1(; k/2; b²/4), where I_ν underflows


def annealed_gamma(n_tokens: int, d_model: int, rho: float) -> float:
    """The finite-``d`` estimate of the module docstring for the ``simplex`` input: the root in
    ``γ`` of ``(1 - ρ) β - log(N - 1) - log M_{d-1}((1 - ρ) β)``, ``β = γ log N``; NaN when there
    is none below ``γ = 50 γ_c``."""
    from scipy.optimize import brentq

    L = math.log(n_tokens)

    def gap(gamma: float) -> float:
        b = (1 - rho) * gamma * L
        return b - math.log(n_tokens - 1) - _log_mgf(b, d_model - 1)

    hi = 50 * paper_gamma(rho)
    grid = np.linspace(0.05, hi, 400)
    vals = [gap(g) for g in grid]
    for g0, g1, v0, v1 in zip(grid, grid[1:], vals, vals[1:]):
        if v0 < 0 <= v1:
            return float(brentq(gap, g0, g1, xtol=1e-10))
    return float("nan")


def _segment(r: np.ndarray, level: float) -> int | None:
    """Index ``i`` of the first grid segment on which ``r`` reaches ``level`` from below, or None."""
    return next((i for i in range(len(r) - 1) if r[i] < level <= r[i + 1]), None)


def _crossing(gamma: np.ndarray, r: np.ndarray, level: float) -> float:
    """First ``γ`` where ``r`` reaches ``level`` from below, linearly interpolated; NaN if none."""
    i = _segment(r, level)
    if i is None:
        return float("nan")
    return float(gamma[i] + (level - r[i]) * (gamma[i + 1] - gamma[i]) / (r[i + 1] - r[i]))


def switch(gamma, ratio) -> dict[str, float]:
    """``{"gamma_switch", "gamma_10", "gamma_90", "width", "relative_width", "slope"}`` of one curve
    ``ratio`` against ``gamma`` (any order): the crossings of :data:`SWITCH_LEVEL` and
    :data:`WIDTH_LEVELS` (NaN where the grid does not bracket one), ``width = γ_90 - γ_10``,
    ``relative_width = width / gamma_switch`` and the ``dr/dγ`` of the segment crossing the switch."""
    order = np.argsort(np.asarray(gamma, dtype=float))
    g, r = np.asarray(gamma, dtype=float)[order], np.asarray(ratio, dtype=float)[order]
    mid = _crossing(g, r, SWITCH_LEVEL)
    lo, hi = (_crossing(g, r, level) for level in WIDTH_LEVELS)
    i = _segment(r, SWITCH_LEVEL)
    slope = float("nan") if i is None else float((r[i + 1] - r[i]) / (g[i + 1] - g[i]))
    return {"gamma_switch": mid, "gamma_10": lo, "gamma_90": hi, "width": hi - lo, "relative_width": (hi - lo) / mid,
            "slope": slope}
