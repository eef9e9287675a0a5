"""Analysis and comparison of mask schedules (docs/theory.md §7, docs/schedules.md).

:func:`describe_schedule` reports the composed graph's facts (centers, QSC, radius) with
the period, the per-layer descriptions and the predicted per-layer collapse rate;
:func:`compare_schedules` ranks schedules by predicted and (optionally) measured rate,
with the attention budget (mean attended pairs per layer) in the table so that
schedules of equal cost can be compared.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .graph import analyze
from .rates import epsilon_lower_bound
from .schedule import MaskSchedule, parse_schedule, schedule_log_rate


def _log_neg_rate(epsilon: float, period: int, radius: int) -> float:
    """``log(-log factor)`` of :func:`schedule_log_rate`, finite for any ``eps^(p r)``."""
    pr = period * radius
    log_x = pr * math.log(epsilon)
    if log_x > -700:
        return math.log(-math.log1p(-math.exp(log_x))) - math.log(pr)
    return log_x - math.log(pr)


def predicted_rate(schedule: MaskSchedule, radius: int | None, *, d_qk: float = 1.0,
                   token_norm: float = 1.0, weight_norm: float = 1.0) -> dict[str, Any]:
    """Envelope rate of a schedule from the a-priori entry bound.

    ``epsilon`` = :func:`~rankcollapse.masks.rates.epsilon_lower_bound` with the largest
    in-degree over the period's masks (A1 bounds ``d_qk``, ``R``, ``C``); the per-layer
    factor is ``(1 - eps^(p r))^(1/(p r))`` (docs/theory.md §7). Keys: ``epsilon``,
    ``log10_rate_per_layer`` (log10 of the factor, < 0) and ``log10_layers_per_decade``;
    None when the composed graph is not QSC (no collapse to one token is implied).
    """
    max_in = max(int(analyze_in_degree(m)) for m in schedule.masks)
    eps = epsilon_lower_bound(d_qk=d_qk, token_norm=token_norm, weight_norm=weight_norm, max_in_degree=max_in)
    if radius is None or radius < 1 or not 0.0 < eps < 1.0:
        return {"epsilon": eps, "log10_rate_per_layer": None, "log10_layers_per_decade": None}
    p = schedule.period
    return {"epsilon": eps,
            "log10_rate_per_layer": schedule_log_rate(eps, p, radius) / math.log(10),
            "log10_layers_per_decade": (math.log(math.log(10.0)) - _log_neg_rate(eps, p, radius)) / math.log(10)}


def analyze_in_degree(mask) -> int:
    """Largest number of keys of a query of ``mask``."""
    return int(np.diff(mask.to_csr().indptr).max())


def describe_schedule(schedule: Any, n: int | None = None, *, per_token: bool = False,
                      **bounds: float) -> dict[str, Any]:
    """JSON-ready description of a schedule: the composed graph's
    :meth:`~rankcollapse.masks.MaskAnalysis.to_dict` keys (``n_tokens``, ``centers``,
    ``radius``, ``quasi_strongly_connected``, ...; ``spec`` is the schedule's), plus
    ``period``, ``edges_per_layer``, ``mean_edges_per_layer``, ``epsilon``,
    ``log10_rate_per_layer``, ``log10_layers_per_decade`` (:func:`predicted_rate`;
    ``bounds`` = its keyword arguments) and ``layers`` (each layer's description).

    Raises MaskError for a bad schedule (see :func:`parse_schedule`).
    """
    sched = parse_schedule(schedule, n) if not isinstance(schedule, MaskSchedule) else schedule
    a = analyze(sched.composed())
    out = a.to_dict(per_token=per_token)
    out["spec"] = sched.spec
    out["composed_spec"] = a.spec
    out["closed_form_agrees"] = None
    out["period"] = sched.period
    out["edges_per_layer"] = sched.edges_per_layer()
    out["mean_edges_per_layer"] = sched.mean_edges()
    out.update(predicted_rate(sched, a.radius if a.quasi_strongly_connected else None, **bounds))
    cache: dict[str, dict] = {}
    for m in sched.masks:
        if m.spec not in cache:
            cache[m.spec] = analyze(m).to_dict()
    out["layers"] = [cache[m.spec] for m in sched.masks]
    return out


def measure_rate(schedule: MaskSchedule, *, d: int = 16, depth: int = 60, n_samples: int = 8,
                 seed: int = 0, d_qk: float = 1.0, quantiles: bool = False):
    """Median over samples of the measured per-layer decay factor of ``μ`` (pure SA,
    Haar ``W_V``, Gaussian ``W_Q, W_K`` of std ``1/√d``, float64) —
    :func:`rankcollapse.theory.bound.fit_rate` of :func:`rankcollapse.dynamics.simulate`.
    With ``quantiles``: ``(q25, median, q75)`` over samples."""
    import torch

    from ..dynamics import gaussian_tokens, simulate
    from ..theory.bound import fit_rate

    X0 = gaussian_tokens(n_samples, schedule.n_tokens, d, seed=seed, std=1 / math.sqrt(d))
    sim = simulate(X0, mask=schedule, depth=depth, d_qk=d_qk, value="orthogonal", query_key="gaussian",
                   seed=seed, dtype=torch.float64, metrics=("mu",))
    rates = fit_rate(sim.metrics["mu"])
    if quantiles:
        q = torch.quantile(rates, torch.tensor([0.25, 0.5, 0.75], dtype=rates.dtype))
        return tuple(float(x) for x in q)
    return float(rates.median())


def compare_schedules(specs: Sequence[Any], n: int, *, measure: bool = False, d: int = 16,
                      depth: int = 60, n_samples: int = 8, seed: int = 0, d_qk: float = 1.0,
                      token_norm: float = 1.0, weight_norm: float = 1.0) -> pd.DataFrame:
    """Rank schedules (plain masks are period-1 schedules) by collapse rate at their cost.

    Columns: ``spec, period, n_tokens, mean_edges_per_layer, quasi_strongly_connected,
    radius`` (of the composed graph), ``epsilon, log10_rate_per_layer,
    log10_layers_per_decade, rank_predicted`` and, with ``measure``, ``measured_rate``
    (median over samples, :func:`measure_rate`), ``measured_q25, measured_q75`` and
    ``rank_measured``. Rank 1 = slowest collapse (most layers
    per decade / measured factor closest to 1); non-QSC schedules rank first (no
    collapse is implied). Compare rows of equal ``mean_edges_per_layer``.
    """
    rows = []
    for spec in specs:
        sched = parse_schedule(spec, n)
        a = analyze(sched.composed())
        r = a.radius if a.quasi_strongly_connected else None
        row = {"spec": sched.spec, "period": sched.period, "n_tokens": n,
               "mean_edges_per_layer": sched.mean_edges(), "quasi_strongly_connected": a.quasi_strongly_connected,
               "radius": r}
        row.update(predicted_rate(sched, r, d_qk=d_qk, token_norm=token_norm, weight_norm=weight_norm))
        if measure:
            q25, med, q75 = measure_rate(sched, d=d, depth=depth, n_samples=n_samples, seed=seed, d_qk=d_qk,
                                         quantiles=True)
            row.update(measured_rate=med, measured_q25=q25, measured_q75=q75)
        rows.append(row)
    df = pd.DataFrame(rows).astype({"radius": "Int64"})
    slow = df["log10_layers_per_decade"].astype(float).fillna(math.inf)
    df["rank_predicted"] = slow.rank(ascending=False, method="min").astype(int)
    if measure:
        df["rank_measured"] = df["measured_rate"].rank(ascending=False, method="min").astype(int)
    return df
