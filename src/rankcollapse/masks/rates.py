"""Collapse-rate envelope of Theorem 1 (spec.md §5.1, reconstructed form) and the
mask comparison table.

For a QSC mask with radius ``r``, pure masked self-attention satisfies
``mu(X(t)) <= C' (1 - eps^r)^(t / (k r))`` with ``k = 1`` (exponent ``"t/r"``) or
``k = 2`` (variant ``"t/(2r)"``), where ``eps`` lower-bounds every allowed attention
entry along the trajectory. All rates are computed in log space so that ``eps^r``
far below the float range (long windows) still gives a finite, exact-to-rounding
``log10`` of the per-layer contraction.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .graph import analyze
from .spec import parse_mask

EXPONENTS = {"t/r": 1, "t/(2r)": 2}


def _k(exponent: str) -> int:
    if exponent not in EXPONENTS:
        raise ConfigError(f"exponent must be one of {sorted(EXPONENTS)}, got {exponent!r}")
    return EXPONENTS[exponent]


def _check_eps_r(epsilon: float, radius: int) -> None:
    if not 0.0 < epsilon < 1.0:
        raise ConfigError(f"epsilon must lie in (0, 1), got {epsilon}")
    if isinstance(radius, bool) or not isinstance(radius, (int, np.integer)) or radius < 1:
        raise ConfigError(f"radius must be an integer >= 1, got {radius!r}")


def log_contraction(epsilon: float, radius: int, *, exponent: str = "t/r") -> float:
    """Natural log of the per-layer factor ``(1 - eps^r)^(1/(k r))`` (a value < 0).

    Uses ``log1p(-eps^r)`` and, when ``eps^r`` underflows, ``-eps^r`` in log space
    (``log1p(-x) = -x + O(x^2)``), so it never returns exactly 0 for ``eps > 0``.

    Raises
    ------
    ConfigError
        ``epsilon`` outside (0, 1), ``radius < 1`` or an unknown exponent.
    """
    k = _k(exponent)
    _check_eps_r(epsilon, radius)
    log_x = radius * math.log(epsilon)  # log(eps^r)
    if log_x > -700:
        return math.log1p(-math.exp(log_x)) / (k * radius)
    return -math.exp(log_x - math.log(k * radius))  # may underflow to -0.0 only below 1e-308


def log10_layers_per_decade(epsilon: float, radius: int, *, exponent: str = "t/r") -> float:
    """``log10`` of the number of layers the envelope needs to fall by 10x:
    ``ln(10) / -log(factor)``, computed in log space (finite even for ``eps^r`` ~ 1e-5000)."""
    k = _k(exponent)
    _check_eps_r(epsilon, radius)
    log_x = radius * math.log(epsilon)
    if log_x > -700:
        log_neg = math.log(-math.log1p(-math.exp(log_x))) - math.log(k * radius)
    else:
        log_neg = log_x - math.log(k * radius)
    return (math.log(math.log(10.0)) - log_neg) / math.log(10.0)


def collapse_envelope(
    t: np.ndarray | Sequence[float] | float, epsilon: float, radius: int, *,
    exponent: str = "t/r", C: float = 1.0,
) -> np.ndarray:
    """Theorem 1 envelope ``C (1 - eps^r)^(t / (k r))`` at layers ``t`` (float64 array).

    Source: Wu et al. 2024, Theorem 1 (spec.md §5.1; exponent variant a parameter).
    """
    t = np.asarray(t, dtype=np.float64)
    if (t < 0).any():
        raise ConfigError("layer indices t must be >= 0")
    return C * np.exp(t * log_contraction(epsilon, radius, exponent=exponent))


def epsilon_lower_bound(
    *, d_qk: float, token_norm: float, weight_norm: float, max_in_degree: int
) -> float:
    """Lower bound on every allowed attention entry.

    With ``||x_i|| <= R`` (``token_norm``) and ``||W_Q||_2, ||W_K||_2 <= C``
    (``weight_norm``, assumption A1), every logit obeys
    ``|s_ij| = |x_i W_Q W_K^T x_j^T| / sqrt(d_qk) <= C^2 R^2 / sqrt(d_qk) =: s``; a row
    with ``|K(i)|`` keys then has ``A_ij >= e^{-s} / (|K(i)| e^{s})``. Hence
    ``eps = exp(-2 C^2 R^2 / sqrt(d_qk)) / max_i |K(i)|`` (in-degree = keys per query).
    Under SA-LN ``R = 1``.

    Raises
    ------
    ConfigError
        Non-positive ``d_qk``, negative norms or an in-degree < 1.
    """
    if d_qk <= 0 or token_norm < 0 or weight_norm < 0:
        raise ConfigError(f"need d_qk > 0 and norms >= 0, got d_qk={d_qk}, "
                          f"token_norm={token_norm}, weight_norm={weight_norm}")
    if max_in_degree < 1:
        raise ConfigError(f"max_in_degree must be >= 1, got {max_in_degree}")
    s = weight_norm**2 * token_norm**2 / math.sqrt(d_qk)
    return math.exp(-2.0 * s) / max_in_degree


def compare_masks(
    specs: Sequence[str], n: int, *, d_qk: float = 1.0, token_norm: float = 1.0,
    weight_norm: float = 1.0, exponent: str = "t/r", max_memory: int | str | None = None,
) -> pd.DataFrame:
    """Table of masks by radius and predicted per-layer contraction.

    Columns: ``spec, n_tokens, n_edges, quasi_strongly_connected, n_centers, radius,
    max_in_degree, epsilon, log10_factor, log10_layers_per_decade``. ``epsilon`` is
    :func:`epsilon_lower_bound` for each mask's own max in-degree; ``log10_factor`` is
    ``log10`` of ``(1 - eps^r)^(1/(k r))``. Non-QSC masks get no rate (NaN): Theorem 1
    gives no collapse to one token there. ``max_memory`` bounds each graph analysis
    (see :func:`~rankcollapse.masks.analyze`).
    """
    rows = []
    for spec in specs:
        a = analyze(parse_mask(spec, n), max_memory=max_memory)
        eps = epsilon_lower_bound(d_qk=d_qk, token_norm=token_norm, weight_norm=weight_norm,
                                  max_in_degree=a.in_degree["max"])
        rate = a.radius is not None and a.radius >= 1 and 0.0 < eps < 1.0
        rows.append({
            "spec": a.spec, "n_tokens": a.n_tokens, "n_edges": a.n_edges,
            "quasi_strongly_connected": a.quasi_strongly_connected,
            "n_centers": len(a.centers), "radius": a.radius, "max_in_degree": a.in_degree["max"],
            "epsilon": eps,
            "log10_factor": log_contraction(eps, a.radius, exponent=exponent) / math.log(10)
            if rate else math.nan,
            "log10_layers_per_decade": log10_layers_per_decade(eps, a.radius, exponent=exponent)
            if rate else math.nan,
        })
    return pd.DataFrame(rows).astype({"radius": "Int64"})
