"""The round-off floor of a computation: one error model for every caller.

A scale-free metric of a collapsed trajectory (``mu/||X||_F``, ``sigma_2/sigma_1``) is 0 in
exact arithmetic and reads at most ``mu_floor(N, d) = 2 (N + d) eps`` of round-off (Higham,
eq. 3.5; derivation and calibration in docs/metrics.md, "Round-off floor"). A value at or
below the floor is a bound, not a measurement.
"""

from __future__ import annotations

import numpy as np

#: Metrics with a scale-free floor (values in [0, 1] relative to ‖X‖): at or below
#: :func:`relative_floor` they read round-off.
FLOOR_METRICS = frozenset({"mu_relative", "sigma_ratio"})
#: Metrics whose underflow (a mean below the dtype's smallest normal number: digits lost on
#: the way to 0) is marked like a scale-free metric at its floor.
UNDERFLOW_METRICS = ("token_radius", "mu")
#: float64 machine epsilon (2^-52).
EPS64 = float(np.finfo(np.float64).eps)
#: N and d of :func:`relative_floor` when the caller knows neither: the largest the committed
#: runs use with a float64 relative metric, so the bound stays conservative.
DEFAULT_TOKENS = 8192
DEFAULT_WIDTH = 576


def epsilon(dtype: str) -> float:
    """Machine epsilon of ``dtype`` (``float32`` 1.19e-7, ``float64`` 2.2e-16); 0 if unknown."""
    try:
        return float(np.finfo(np.dtype(dtype)).eps)
    except TypeError:
        return 0.0


def mu_floor(n_tokens: int, d_model: int, dtype: str = "float64") -> float:
    """Round-off floor ``2 (N + d) eps`` of ``mu(X)/||X||_F`` computed in ``dtype``."""
    return 2 * (int(n_tokens) + int(d_model)) * epsilon(dtype)


def gap_floor(n_tokens: int, d_model: int, dtype: str = "float64") -> float:
    """Round-off floor ``(d + N^2) u``, ``u = eps / 2``, of the cosine gap ``1 - avg_cos``: a
    ``d``-term dot product per cosine (Higham eq. 3.5), ``N (N - 1)`` of them summed (§4.2)."""
    return (int(d_model) + int(n_tokens) ** 2) * epsilon(dtype) / 2


def relative_floor(dtype: str, n_tokens: int | None = None, d_model: int | None = None) -> float:
    """:func:`mu_floor` of ``(N, d)`` (:data:`DEFAULT_TOKENS` / :data:`DEFAULT_WIDTH` where not
    given); 0 for an unknown dtype."""
    return mu_floor(n_tokens or DEFAULT_TOKENS, d_model or DEFAULT_WIDTH, dtype)


def mark_floor(rows: list[dict], names: list[str], dtype: str, n_tokens: int, d_model: int) -> dict:
    """Add ``at_floor`` to every row (a layer's mean of each metric, None where undefined):
    the ``names`` of :data:`FLOOR_METRICS` at or below :func:`relative_floor` and of
    :data:`UNDERFLOW_METRICS` below the smallest normal number; returns the floor's description."""
    floor, tiny = relative_floor(dtype, n_tokens, d_model), float(np.finfo(np.dtype(dtype)).tiny)
    for row in rows:
        row["at_floor"] = [k for k in names if row[k] is not None and (
            (k in FLOOR_METRICS and row[k] <= floor) or (k in UNDERFLOW_METRICS and 0 < row[k] < tiny))]
    return {"dtype": dtype, "epsilon": epsilon(dtype), "floor": floor, "n_tokens": n_tokens, "d_model": d_model,
            "metrics": sorted(m for m in names if m in FLOOR_METRICS),
            "smallest_normal": tiny, "underflow_metrics": sorted(m for m in names if m in UNDERFLOW_METRICS)}
