"""Masks and schedules compared by Theorem 1's collapse rate (docs/theory.md §7; quantities
from :mod:`.envelope`, measured rates from :func:`~rankcollapse.theory.fit_rate`)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import pandas as pd

from ..dynamics.config import RunConfig
from ..masks import analyze, parse_mask
from ..masks.schedule import MaskSchedule, parse_schedule
from .envelope import check_exponent, mask_terms, predicted_rate, schedule_terms, theorem1_terms

#: Keys of :func:`describe_schedule` / columns of :func:`compare_schedules` from the terms.
TERM_KEYS = ("period_radius", "scrambling_length", "effective_radius")


def describe_schedule(schedule: Any, n_tokens: int | None = None, *, per_token: bool = False,
                      **bounds: float) -> dict[str, Any]:
    """JSON-ready description of a schedule: the composed graph's
    :meth:`~rankcollapse.masks.MaskAnalysis.to_dict` (``spec`` the schedule's), ``period``,
    ``edges_per_layer``, ``mean_edges_per_layer``, the :data:`TERM_KEYS`, the keys of
    :func:`~rankcollapse.theory.envelope.predicted_rate` (``bounds``: its keyword arguments) and
    each layer's description (``layers``). Raises MaskError for a bad schedule."""
    sched = parse_schedule(schedule, n_tokens) if not isinstance(schedule, MaskSchedule) else schedule
    a = analyze(sched.composed())
    out = a.to_dict(per_token=per_token)
    out.update(spec=sched.spec, composed_spec=a.spec, closed_form_agrees=None, period=sched.period,
               edges_per_layer=sched.edges_per_layer(), mean_edges_per_layer=sched.mean_edges())
    terms = schedule_terms(sched, a)
    out.update({k: getattr(terms, k) for k in TERM_KEYS})
    out.update(predicted_rate(terms, **bounds))
    cache: dict[str, dict] = {}
    for m in sched.masks:
        if m.spec not in cache:
            cache[m.spec] = analyze(m).to_dict()
    out["layers"] = [cache[m.spec] for m in sched.masks]
    return out


def measure_rate(schedule: MaskSchedule, run: RunConfig, *, d_model: int = 16, n_samples: int = 8,
                 d_qk: float = 1.0, quantiles: bool = False):
    """Median over samples (with ``quantiles``: ``(q25, median, q75)``) of the :func:`fit_rate` of μ
    under pure SA (Haar ``W_V``, Gaussian ``W_Q, W_K`` and ``X(0)`` of std ``1/√d``) run by ``run``."""
    import torch

    from ..dynamics import gaussian_tokens, simulate
    from .bound import fit_rate

    X0 = gaussian_tokens(n_samples, schedule.n_tokens, d_model, seed=run.seed, std=1 / math.sqrt(d_model))
    sim = simulate(X0, schedule, d_qk=d_qk, value="orthogonal", query_key="gaussian", metrics=("mu",), run=run)
    rates = fit_rate(sim.metrics["mu"])
    if quantiles:
        q = torch.quantile(rates, torch.tensor([0.25, 0.5, 0.75], dtype=rates.dtype))
        return tuple(float(x) for x in q)
    return float(rates.median())


def compare_schedules(specs: Sequence[Any], n_tokens: int, *, measure: RunConfig | None = None, d_model: int = 16,
                      n_samples: int = 8, d_qk: float = 1.0, token_norm: float = 1.0, weight_norm: float = 1.0,
                      exponent: str = "t/r") -> pd.DataFrame:
    """Rank schedules (masks are period-1 schedules) by collapse rate at their cost.

    Columns: ``spec, period, n_tokens, mean_edges_per_layer, quasi_strongly_connected, radius``, the
    :data:`TERM_KEYS`, the :func:`~rankcollapse.theory.envelope.predicted_rate` keys, ``rank_predicted``
    and, with ``measure`` (a :class:`~rankcollapse.dynamics.RunConfig`), ``measured_rate, measured_q25,
    measured_q75`` (:func:`measure_rate`), ``rank_measured``. Rank 1 = slowest collapse (non-QSC first).
    Raises MaskError for a bad schedule, ConfigError for an unknown exponent, bad ``d_qk`` or norms.
    """
    check_exponent(exponent)
    rows = []
    for spec in specs:
        sched = parse_schedule(spec, n_tokens)
        terms = theorem1_terms(sched)
        row = {"spec": sched.spec, "period": sched.period, "n_tokens": n_tokens,
               "mean_edges_per_layer": sched.mean_edges(),
               "quasi_strongly_connected": terms.quasi_strongly_connected, "radius": terms.radius}
        row.update({k: getattr(terms, k) for k in TERM_KEYS})
        row.update(predicted_rate(terms, d_qk=d_qk, token_norm=token_norm, weight_norm=weight_norm,
                                   exponent=exponent))
        if measure is not None:
            q25, med, q75 = measure_rate(sched, measure, d_model=d_model, n_samples=n_samples, d_qk=d_qk,
                                         quantiles=True)
            row.update(measured_rate=med, measured_q25=q25, measured_q75=q75)
        rows.append(row)
    df = pd.DataFrame(rows).astype({k: "Int64" for k in ("radius", *TERM_KEYS)})
    slow = df["log10_layers_per_decade"].astype(float).fillna(math.inf)
    df["rank_predicted"] = slow.rank(ascending=False, method="min").astype(int)
    if measure is not None:
        df["rank_measured"] = df["measured_rate"].rank(ascending=False, method="min").astype(int)
    return df


def compare_masks(specs: Sequence[str], n_tokens: int, *, d_qk: float = 1.0, token_norm: float = 1.0,
                  weight_norm: float = 1.0, exponent: str = "t/r",
                  max_memory: int | str | None = None) -> pd.DataFrame:
    """Table of masks by radius and predicted per-layer contraction: ``spec, n_tokens, n_edges,
    quasi_strongly_connected, n_centers, radius, max_in_degree, epsilon_bound, log10_factor,
    log10_layers_per_decade`` (:func:`~rankcollapse.theory.envelope.predicted_rate`; NaN when not
    QSC). ``max_memory`` bounds each graph analysis (:func:`~rankcollapse.masks.analyze`).
    Raises MaskError for a bad spec, ConfigError for an unknown exponent, bad ``d_qk`` or norms.
    """
    rows = []
    for spec in specs:
        a = analyze(parse_mask(spec, n_tokens), max_memory=max_memory)
        rate = predicted_rate(mask_terms(a), d_qk=d_qk, token_norm=token_norm, weight_norm=weight_norm,
                              exponent=exponent)
        nan_if_none = {k: math.nan if v is None else v for k, v in rate.items()}
        rows.append({"spec": a.spec, "n_tokens": a.n_tokens, "n_edges": a.n_edges,
                     "quasi_strongly_connected": a.quasi_strongly_connected, "n_centers": len(a.centers),
                     "radius": a.radius, "max_in_degree": a.in_degree["max"],
                     "epsilon_bound": rate["epsilon_bound"], "log10_factor": nan_if_none["log10_rate_per_layer"],
                     "log10_layers_per_decade": nan_if_none["log10_layers_per_decade"]})
    return pd.DataFrame(rows).astype({"radius": "Int64"})
