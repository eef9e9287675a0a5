"""The round-off floor of a computation: one error model for every caller.

A scale-free metric of a collapsed trajectory (``mu/||X||_F``, ``sigma_2/sigma_1``) is
0 in exact arithmetic; computed, it reads round-off of the network code. The floor is
the largest value round-off can produce there, from the computation's machine epsilon
``eps`` (float64 2.2e-16, float32 1.19e-7), the number of tokens N and the width d:

    mu_floor(N, d) = 2 (N + d) eps

(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 3.5: a layer's
output entry is a convex combination of N rows, relative error <= gamma_N ~ N u, plus
gamma_d + u for a normalisation over d entries, so two tokens of a consensus differ by
at most ``2 (N + d + 1) u |x_j|`` to first order; mu's mean token and differences add
``(N + 1) u |x_j|``: the computed ``m`` of a consensus is at most
``(3N + 2d + 3) u <= 2 (N + d) eps``, ``u = eps / 2``). Every layer of a collapsed
trajectory starts from a consensus again, so the bound does not grow with depth.

Calibration (``benchmarks/floor_calibration.py``, docs/metrics.md "Round-off floor"):
float64 runs of every simulated variant (pure, sphere, layernorm, skip, post_ln) under
complete, causal and windowed masks from exactly collapsed starts ``X0 = 1 x^T``, N 16 to
512, d 16 to 384, 64 layers, read at most a few eps, and collapsed random starts level
off at 1 to 6 eps: the model's margin over the worst reading is >= 10 at every (N, d).

A value at or below the floor is a bound, not a measurement; a ratio or rate with such a
value in it is a bound (``experiments.quantities.combine_bounds``).

Where N and d are not known (a table row records neither), :func:`relative_floor` uses
:data:`DEFAULT_TOKENS` and :data:`DEFAULT_WIDTH`, the largest the committed runs use with a
float64 relative metric (N = 8,192 tokens, d = 576), so the bound stays conservative.
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
#: N and d of :func:`relative_floor` when the caller knows neither (see module docstring).
DEFAULT_TOKENS = 8192
DEFAULT_WIDTH = 576


def epsilon(dtype: str) -> float:
    """Machine epsilon of ``dtype`` (``float32`` 1.19e-7, ``float64`` 2.2e-16); 0 if unknown."""
    try:
        return float(np.finfo(np.dtype(dtype)).eps)
    except TypeError:
        return 0.0


def mu_floor(n_tokens: int, d_model: int, dtype: str = "float64") -> float:
    """Round-off floor of ``mu(X)/||X||_F`` computed in ``dtype``: ``2 (N + d) eps``
    (module docstring: the model and its calibration)."""
    return 2 * (int(n_tokens) + int(d_model)) * epsilon(dtype)


def gap_floor(n_tokens: int, d_model: int, dtype: str = "float64") -> float:
    """Round-off floor of the cosine gap ``1 - mean_{i != j} cos(x_i, x_j)``: ``(d + N^2) u``
    with ``u = eps / 2``. Each cosine is a ``d``-term dot product of unit rows (error
    ``<= gamma_d ~ d u``, Higham eq. 3.5) and the mean sums ``N (N - 1)`` of them (recursive
    summation: ``<= gamma_{N(N-1)}`` relative, Higham §4.2)."""
    return (int(d_model) + int(n_tokens) ** 2) * epsilon(dtype) / 2


def relative_floor(dtype: str, n_tokens: int | None = None, d_model: int | None = None) -> float:
    """Floor of a scale-free metric in ``[0, 1]`` computed in ``dtype``: :func:`mu_floor`
    of ``(N, d)``, :data:`DEFAULT_TOKENS` / :data:`DEFAULT_WIDTH` where not given; 0 for an
    unknown dtype (no floor)."""
    return mu_floor(n_tokens or DEFAULT_TOKENS, d_model or DEFAULT_WIDTH, dtype)


def mark_floor(rows: list[dict], names: list[str], dtype: str, n_tokens: int, d_model: int) -> dict:
    """Add ``at_floor`` to every row (a layer's mean of each metric, None where undefined):
    the ``names`` in :data:`FLOOR_METRICS` at or below :func:`relative_floor` (the digits are
    rounding) and in :data:`UNDERFLOW_METRICS` positive and below the dtype's smallest normal
    number (underflow); returns the floor's description."""
    floor, tiny = relative_floor(dtype, n_tokens, d_model), float(np.finfo(np.dtype(dtype)).tiny)
    for row in rows:
        row["at_floor"] = [k for k in names if row[k] is not None and (
            (k in FLOOR_METRICS and row[k] <= floor) or (k in UNDERFLOW_METRICS and 0 < row[k] < tiny))]
    return {"dtype": dtype, "epsilon": epsilon(dtype), "floor": floor, "n_tokens": n_tokens, "d_model": d_model,
            "metrics": sorted(m for m in names if m in FLOOR_METRICS),
            "smallest_normal": tiny, "underflow_metrics": sorted(m for m in names if m in UNDERFLOW_METRICS)}
