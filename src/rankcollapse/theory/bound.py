"""Theorem 1 (spec.md §5.1; envelope in :mod:`.envelope`) checked against measurement: ``ε`` is
measured on the same trajectory, so a point above the envelope is a bug (or a counterexample).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from ..masks import resolve_mask
from ..masks.schedule import is_schedule
from .envelope import require_theorem1
from .measured import (BoundResult, EnvelopeViolation, check_run, envelope_result, fit_rate, measured_epsilon,
                       orthogonal_run)
from .schedule_bound import check_schedule_bound

__all__ = ["BoundResult", "EnvelopeViolation", "check_collapse_bound", "fit_rate", "radius_sweep"]


def check_collapse_bound(mask: Any, *, n_tokens: int | None = None, d_model: int = 16, depth: int = 60,
                         n_samples: int = 8, seed: int = 0, exponent: str = "t/r", d_qk: float = 1.0,
                         qk_scale: float = 1.0, X0: torch.Tensor | None = None) -> BoundResult:
    """Run pure SA with per-layer Haar-orthogonal ``W_V`` and check Theorem 1's envelope.

    The trajectory is that of :func:`rankcollapse.dynamics.simulate` with ``value="orthogonal"``,
    ``query_key=result.config["query_key"]`` and the same seed (:func:`.measured.orthogonal_run`).

    Parameters
    ----------
    mask : Mask, bool ``(N, N)`` or spec string (with ``n_tokens``); QSC with self-loops.
        A schedule is checked by :func:`~rankcollapse.theory.schedule_bound.check_schedule_bound`.
    d_model, depth, n_samples, seed : width d, layers, batch size and seed (weights, X(0)).
    exponent : ``"t/r"`` or ``"t/(2r)"``.
    d_qk, qk_scale : temperature, and std·√d of the Gaussian ``W_Q, W_K`` entries (A1).
    X0 : optional ``(B, N, d)`` inputs; default Gaussian with entries of std ``1/√d``.

    A measured point above the envelope also emits an :class:`EnvelopeViolation` warning.

    Raises ConfigError for an unknown exponent, fewer than 2 tokens, ``depth``/``n_samples``/``d_model``
    < 1, a mask that is not QSC or lacks self-loops, ``X0`` of the wrong shape; MaskError for a spec
    without ``n_tokens`` or an invalid mask.

    See Also
    --------
    rankcollapse.theory.envelope_rate : the envelope's rate before any run.
    rankcollapse.theory.theorem1_terms : the mask's radius and connectivity terms.
    rankcollapse.dynamics.simulate : the trajectory itself.

    Examples
    --------
    >>> r = check_collapse_bound("causal_sliding_window:w=2", n_tokens=6, d_model=4, depth=12, n_samples=2)
    >>> r.radius, r.mu.shape  # radius of the window graph; (depth + 1, n_samples)
    (5, torch.Size([13, 2]))
    >>> r.holds, r.measured_rate < 1  # measured mu below the envelope; it decays
    (True, True)
    """
    if is_schedule(mask):  # per-layer masks: the envelope of the composed graph (docs/theory.md §7)
        return check_schedule_bound(mask, n_tokens=n_tokens, d_model=d_model, depth=depth, n_samples=n_samples, seed=seed,
                                    exponent=exponent, d_qk=d_qk, qk_scale=qk_scale, X0=X0)
    check_run(exponent, depth, n_samples, d_model)
    m = resolve_mask(mask, n_tokens)
    terms = require_theorem1(m)
    N, r = m.n_tokens, int(terms.radius)
    X0, sim = orthogonal_run(X0, m, N, d_model, n_samples=n_samples, depth=depth, d_qk=d_qk, qk_scale=qk_scale, seed=seed)
    eps = measured_epsilon(sim.attention, [m.to_dense()] * depth)
    cfg = {"n_tokens": N, "d_model": X0.shape[2], "depth": depth, "n_samples": X0.shape[0], "seed": seed, "d_qk": d_qk,
           "qk_scale": qk_scale, "value": "orthogonal", "query_key": sim.config["query_key"]}
    return envelope_result(m.spec, r, r, exponent, X0, sim.metrics["mu"], eps, cfg)


def radius_sweep(n_tokens: int = 32, widths: tuple[int, ...] = (32, 17, 9, 5, 3, 2), **kwargs: Any) -> pd.DataFrame:
    """Theorem 1 check across ``causal_sliding_window:w`` masks: a table ``mask, width, radius,
    epsilon_measured`` (median), ``measured_rate, envelope_rate, n_violations, holds``, one row per width."""
    rows = []
    for w in widths:
        res = check_collapse_bound(f"causal_sliding_window:w={w}", n_tokens=n_tokens, **kwargs)
        rows.append({"mask": res.mask, "width": w, "radius": res.radius, "epsilon_measured": float(res.epsilon_measured.median()),
                     "measured_rate": res.measured_rate, "envelope_rate": res.envelope_rate,
                     "n_violations": res.n_violations, "holds": res.holds})
    return pd.DataFrame(rows)
