"""The regime label of a phase cell and the theory's prediction for it.

The rule (docs/phase.md; thresholds fixed before any sweep was run, never tuned):

Per trajectory (one input under one weight draw), after ``T`` layers, with
``m(t) = mu(X(t)) / ||X(t)||_F`` and ``Y(t) = X(t) / ||X(t)||_F``:

1. ``diverging``: X overflowed, or ``||X(T)||_F / ||X(0)||_F > DIVERGE_RATIO``;
2. ``rank_collapse``: ``m(T) < COLLAPSED``;
3. ``aligned_without_consensus``: every token on one line, ``sigma_2(X(T)) <= RANK_RTOL
   sigma_1`` (so ``avg |cos| = 1`` to that tolerance), while ``m(T) >= ALIVE``: the tokens
   are parallel but their norms differ, which attention whose rows do not sum to 1
   produces (a sink: docs/theory.md, "Attention that is not row-stochastic"), and so do
   antipodal rows on the sphere; ``m`` alone would call it "not collapsed";
4. ``stable_rank_k``: ``||Y(T) - Y(T - w)||_F < CONVERGED`` with ``w = max(1, T // 10)``
   and ``m(T) >= ALIVE``; ``k = #{sigma_i(X(T)) > RANK_RTOL sigma_1}`` (``k >= 2``: a
   rank-one state is rule 3);
5. ``collapsing_slowly``: ``m`` is still falling at the end: the 95% upper bound of the
   least-squares slope of ``log10 m(t)`` over the last ``max(2, T // 4)`` layers
   (:func:`tail_rate`), the trajectory's ``rate_last_bound``, is below ``-RATE_RESOLVED`` (a slope float64 can resolve: round-off
   of ``log10 m`` is ~1e-15 per point, so a flat ``m`` cannot pass by noise);
6. ``uniform_attention``: the mean normalised attention row entropy over the last
   ``max(1, T // 4)`` layers is ``>= UNIFORM``;
7. ``one_hot_attention``: that entropy is ``<= ONE_HOT`` (the literature's "entropy
   collapse", attention concentrating on one key);
8. ``undecided`` otherwise (still moving, or ``COLLAPSED <= m(T) < ALIVE``).

A cell's label is the label of more than half of its trajectories, else ``undecided``;
a majority ``uniform_attention`` or ``one_hot_attention`` becomes ``collapsing_slowly``
when the cell's tail-rate t-interval over trajectories (``rate_last_lo``, ``rate_last_hi``: an
interval for the mean slope, not a trajectory's bound) lies below ``-RATE_RESOLVED`` (μ still
falling). ``frac_<regime>`` gives the fraction of trajectories of each regime beside the label;
``frac_rate_last_falling`` the fraction whose ``rate_last_bound`` passes rule 5's test and
``rate_last_bound_max`` the largest ``rate_last_bound`` (the columns rule 5 can be checked on).
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from scipy import stats

from ..metrics.floor import gap_floor, mu_floor  # noqa: F401  (the floor model; re-exported)
from ..metrics.rate import LAWS, fit_decay_law, least_squares_rate

COLLAPSED = 1e-6
ALIVE = 1e-3
CONVERGED = 1e-4
RANK_RTOL = 1e-4
UNIFORM = 0.95
ONE_HOT = 0.05
DIVERGE_RATIO = 1e12
RATE_FLOOR = 1e-12  # m(t) below this is float64 round-off: excluded from the rate fit
MU_FLOOR = 1e-300  # the floor marker: a cell's mu_relative when most of its m(T) are at the floor (mu_floor)
RATE_RESOLVED = 1e-10  # decades/layer: tail slopes closer to 0 are float64 round-off of a flat m
REGIMES = ("rank_collapse", "collapsing_slowly", "uniform_attention", "one_hot_attention",
           "aligned_without_consensus", "stable_rank_k", "diverging", "undecided")
#: labels that say the attention pattern has settled, not that collapse stopped
ATTENTION_LABELS = ("uniform_attention", "one_hot_attention")


def fit_log10_rate(m: np.ndarray) -> float:
    """Least-squares slope of ``log m(t)`` against ``t`` in decades per layer (negative =
    collapsing; :func:`rankcollapse.metrics.rate.least_squares_rate`) over the layers before
    ``m`` first drops below :data:`RATE_FLOOR`. A trajectory below the floor from layer 1
    gets the bound ``log10(RATE_FLOOR / m(0))`` (it fell at least that fast); NaN with
    fewer than two layers otherwise."""
    fit = least_squares_rate(m, floor=RATE_FLOOR, before_floor=True)
    if fit.n_layers[0] == 1 and m.size > 1:
        return float(np.log10(RATE_FLOOR) - np.log10(m[0]))
    return float(fit.decades[0])


def tail_rate(m: np.ndarray) -> tuple[float, float]:
    """``(slope, 95% upper bound)`` of the least-squares fit of ``log10 m(t)`` against ``t``
    over the last ``max(2, T // 4) + 1`` points of ``m`` ``(T+1,)`` (decades per layer).

    The bound is ``slope + t_{0.975, n-2} · SE`` (ordinary least squares, residuals
    treated as independent). NaN, NaN when a point of the window is below
    :data:`RATE_FLOOR` (the state is at round-off, not falling) or non-finite.
    """
    T = m.size - 1
    y = m[-(max(2, T // 4) + 1):]
    if y.size < 3 or not (y >= RATE_FLOOR).all() or not np.isfinite(y).all():
        return float("nan"), float("nan")
    fit = stats.linregress(np.arange(y.size, dtype=np.float64), np.log10(y))
    return float(fit.slope), float(fit.slope + _t975(y.size - 2) * fit.stderr)


@lru_cache(maxsize=64)
def _t975(df: int) -> float:
    """Student's t quantile ``t_{0.975, df}`` (``scipy.stats.t.ppf``; one window length per
    cell, so computed once per length)."""
    return stats.t.ppf(0.975, df)


def law_measures(avg_cos: np.ndarray, n_tokens: int, d_model: int) -> list[dict[str, Any]]:
    """Per trajectory, the decay law of the cosine gap ``g(t) = 1 - avg_cos(t)`` over depth
    (``avg_cos`` ``(T+1, B)``): :func:`rankcollapse.metrics.rate.fit_decay_law` on
    ``t = 1..T`` with the floor :func:`gap_floor` (a gap at the floor from layer 1 on is
    ``undecided``, not a law). Keys ``law``, ``law_exponent`` (``p`` of ``g ~ t^p``),
    ``law_rate`` (``b`` of ``g ~ e^{bt}``, natural log per layer), ``law_r2_exp``,
    ``law_r2_power``."""
    fit = fit_decay_law(1.0 - avg_cos, floor=gap_floor(n_tokens, d_model))
    return [{"law": str(fit.law[b]), "law_exponent": float(fit.exponent[b]), "law_rate": float(fit.rate[b]),
             "law_r2_exp": float(fit.r2_exponential[b]), "law_r2_power": float(fit.r2_power[b])}
            for b in range(avg_cos.shape[1])]


def trajectory_measures(metrics: dict[str, torch.Tensor], states: list[torch.Tensor],
                        entropy: np.ndarray) -> list[dict[str, Any]]:
    """One dict per batch element of a simulation: ``mu_relative`` (final) and its round-off
    floor ``mu_floor`` (:func:`mu_floor`), ``norm_ratio``,
    ``change`` (of the normalised state over the last ``w`` layers), ``numerical_rank``,
    ``stable_rank``, ``k``, ``rate``, ``rate_last`` and its 95% upper bound ``rate_last_bound``
    (:func:`tail_rate`; rule 5 reads it),
    ``attention_entropy`` (mean over layers whose input had ``m >= ALIVE``, else layer 1),
    ``entropy_last`` (last quarter of layers) and, when ``metrics`` has ``avg_cos``, the
    decay law of the cosine gap (:func:`law_measures`)."""
    from ..metrics import numerical_rank, stable_rank

    m = metrics["mu_relative"].numpy()  # (T+1, B)
    T = m.shape[0] - 1
    w = max(1, T // 10)
    XT, Xw, X0 = states[-1], states[-1 - w], states[0]
    nT, nw, n0 = (torch.linalg.matrix_norm(X).numpy() for X in (XT, Xw, X0))
    change = torch.linalg.matrix_norm(XT / torch.as_tensor(nT)[:, None, None]
                                      - Xw / torch.as_tensor(nw)[:, None, None]).numpy()
    sv = torch.linalg.svdvals(XT)
    k = (sv > RANK_RTOL * sv[:, :1]).sum(-1).numpy()
    nr, sr = numerical_rank(XT).numpy(), stable_rank(XT).numpy()
    laws = (law_measures(metrics["avg_cos"].numpy(), X0.shape[-2], X0.shape[-1]) if "avg_cos" in metrics
            else [{}] * m.shape[1])
    floor = mu_floor(X0.shape[-2], X0.shape[-1])
    out = []
    for b in range(m.shape[1]):
        alive = m[:-1, b] >= ALIVE  # input of layer t+1 not yet collapsed
        ent = float(entropy[alive, b].mean()) if alive.any() else float(entropy[0, b])
        slope, slope_hi = tail_rate(m[:, b])
        out.append({"diverged": False, "mu_relative": float(m[-1, b]), "mu_floor": floor, "norm_ratio": float(nT[b] / n0[b]),
                    "change": float(change[b]), "k": int(k[b]), "numerical_rank": float(nr[b]),
                    "stable_rank": float(sr[b]), "rate": fit_log10_rate(m[:, b]), "rate_last": slope,
                    "rate_last_bound": slope_hi, "attention_entropy": ent,
                    "entropy_last": float(entropy[-max(1, T // 4):, b].mean()), **laws[b]})
    return out


def label_trajectory(tr: dict[str, Any]) -> str:
    """The regime of one trajectory (module docstring's rule)."""
    if tr["diverged"] or not tr["norm_ratio"] <= DIVERGE_RATIO:
        return "diverging"
    if tr["mu_relative"] < COLLAPSED:
        return "rank_collapse"
    if tr["k"] == 1 and tr["mu_relative"] >= ALIVE:
        return "aligned_without_consensus"
    if tr["change"] < CONVERGED and tr["mu_relative"] >= ALIVE:
        return "stable_rank_k"
    if _tail_falling(tr):
        return "collapsing_slowly"
    if tr["entropy_last"] >= UNIFORM:
        return "uniform_attention"
    if tr["entropy_last"] <= ONE_HOT:
        return "one_hot_attention"
    return "undecided"


def _tail_falling(tr: dict[str, Any]) -> bool:
    """Rule 5's test: the trajectory's own tail-rate bound ``rate_last_bound`` < ``-RATE_RESOLVED``."""
    return bool(tr.get("rate_last_bound", float("nan")) < -RATE_RESOLVED)


def _mean(values: list[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")


def _max(values: list[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return float(max(v)) if v else float("nan")


def _t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval of the finite ``values`` (NaN half-width below 2 values)."""
    v = np.array([x for x in values if math.isfinite(x)])
    if v.size >= 2:
        half = float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    else:
        half = float("nan")
    mean = float(v.mean()) if v.size else float("nan")
    return mean, mean - half, mean + half


def law_cell(trajectories: list[dict[str, Any]]) -> dict[str, Any]:
    """The decay law of a cell: ``law`` is the law of more than half of its trajectories
    (a diverged one counts as ``undecided``), else ``undecided`` (the regime's majority
    rule); ``law_exponent``, ``law_rate``, ``law_r2_exp``, ``law_r2_power`` are medians
    over the trajectories with a finite value (NaN if none); ``frac_law_<law>`` the
    fractions. Empty when the trajectories carry no law (no ``avg_cos`` recorded); a cell
    whose trajectories all diverged is ``undecided`` with NaN measures."""
    if not any("law" in t or t["diverged"] for t in trajectories):
        return {}
    laws = [t.get("law", "undecided") if not t["diverged"] else "undecided" for t in trajectories]
    top, n_top = Counter(laws).most_common(1)[0]
    row: dict[str, Any] = {"law": top if n_top * 2 > len(laws) else "undecided"}
    for key in ("law_exponent", "law_rate", "law_r2_exp", "law_r2_power"):
        v = [t[key] for t in trajectories if not t["diverged"] and math.isfinite(t.get(key, math.nan))]
        row[key] = float(np.median(v)) if v else float("nan")
    row.update({f"frac_law_{law}": laws.count(law) / len(laws) for law in LAWS})
    return row


def mu_cell(mus: list[float], floor: float = 0.0) -> dict[str, float]:
    """The cell's ``mu_relative`` from the final ``m(T)`` of its trajectories that did not
    diverge: the floor marker ``MU_FLOOR`` when more than half of them are at the floor,
    at or below ``max(floor, MU_FLOOR)`` (``floor``: :func:`mu_floor` of the cell's N and
    d, so a last-bit difference of round-off cannot move a trajectory across it; the
    regime's majority rule), else the geometric mean over those above it (NaN when there
    are none); ``frac_mu_floor`` is the fraction at the floor. A mean of the marker with
    real values would be neither a measurement nor the floor (``1e-300`` and ``1e-16``
    give ``1e-158``)."""
    if not mus:
        return {"mu_relative": float("nan"), "frac_mu_floor": float("nan")}
    above = np.array([m for m in mus if m > max(floor, MU_FLOOR)], dtype=np.float64)
    mu = float(np.exp(np.mean(np.log(above)))) if above.size * 2 >= len(mus) else MU_FLOOR
    return {"mu_relative": mu, "frac_mu_floor": 1.0 - above.size / len(mus)}


def label_cell(trajectories: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate trajectories into a cell row: means of the measures (``mu_relative`` and
    ``frac_mu_floor``: :func:`mu_cell`), the rate's and the tail rate's mean and 95% t-interval over
    trajectories (``rate_last_lo``, ``rate_last_hi``), ``rate_last_bound_max`` (max over
    trajectories of the per-trajectory bound rule 5 reads, NaN if none is finite) and
    ``frac_rate_last_falling`` (fraction of all trajectories passing rule 5's test), the
    per-regime fractions ``frac_<regime>``, the majority ``regime``
    (module docstring), its ``k`` (median over its trajectories) and the decay law
    (:func:`law_cell`)."""
    labels = [label_trajectory(t) for t in trajectories]
    counts = Counter(labels)
    top, n_top = counts.most_common(1)[0]
    regime = top if n_top * 2 > len(labels) else "undecided"
    ok = [t for t in trajectories if not t["diverged"]]
    rate, rate_lo, rate_hi = _t_interval([t["rate"] for t in ok])
    last, last_lo, last_hi = _t_interval([t.get("rate_last", float("nan")) for t in ok])
    if regime in ATTENTION_LABELS and last_hi < -RATE_RESOLVED:  # attention settled, but mu still falling
        regime = "collapsing_slowly"
    row = {
        **mu_cell([t["mu_relative"] for t in ok], max((t.get("mu_floor", 0.0) for t in ok), default=0.0)),
        "numerical_rank": _mean([t["numerical_rank"] for t in ok]),
        "stable_rank": _mean([t["stable_rank"] for t in ok]),
        "attention_entropy": _mean([t["attention_entropy"] for t in ok]),
        "entropy_last": _mean([t["entropy_last"] for t in ok]),
        "rate": rate, "rate_lo": rate_lo, "rate_hi": rate_hi,
        "rate_last": last, "rate_last_lo": last_lo, "rate_last_hi": last_hi,
        "rate_last_bound_max": _max([t.get("rate_last_bound", float("nan")) for t in ok]),
        "frac_rate_last_falling": sum(_tail_falling(t) for t in ok) / len(labels),
        "regime": regime,
        "k": int(np.median([t["k"] for t, lab in zip(trajectories, labels) if lab == "stable_rank_k"]))
        if regime == "stable_rank_k" else 0,
        "n_trajectories": len(labels),
    }
    row.update({f"frac_{r}": counts.get(r, 0) / len(labels) for r in REGIMES})
    row.update(law_cell(trajectories))
    return row


from .predict import theory_prediction  # noqa: E402,F401  (re-exported: the rule and the prediction sit side by side)
