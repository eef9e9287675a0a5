"""The regime label of a phase cell: per trajectory the first of the rules in docs/phase.md,
"Measures and the regime rule" (thresholds fixed before any sweep ran), and per cell the
majority label of its trajectories (:func:`label_cell`).
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from scipy import stats

from ..metrics import compute_metrics
from ..metrics.floor import gap_floor, mu_floor  # noqa: F401  (the floor model; re-exported)
from ..metrics.rate import LAWS, fit_decay_law, least_squares_rate
from .predict import theory_prediction  # noqa: F401  (re-exported: the rule and the prediction side by side)

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
    """Least-squares slope of ``log m(t)`` in decades per layer over the layers before ``m``
    first drops below :data:`RATE_FLOOR`; below it from layer 1: the bound
    ``log10(RATE_FLOOR / m(0))``."""
    fit = least_squares_rate(m, floor=RATE_FLOOR, before_floor=True)
    if fit.n_layers[0] == 1 and m.size > 1:
        return float(np.log10(RATE_FLOOR) - np.log10(m[0]))
    return float(fit.decades[0])


def tail_rate(m: np.ndarray) -> tuple[float, float]:
    """``(slope, slope + t_{0.975, n-2} SE)`` of ``log10 m(t)`` over the last ``max(2, T // 4) + 1``
    points of ``m`` ``(T+1,)``; NaN, NaN when a point is below :data:`RATE_FLOOR` or not finite."""
    T = m.size - 1
    y = m[-(max(2, T // 4) + 1):]
    if y.size < 3 or not (y >= RATE_FLOOR).all() or not np.isfinite(y).all():
        return float("nan"), float("nan")
    fit = stats.linregress(np.arange(y.size, dtype=np.float64), np.log10(y))
    return float(fit.slope), float(fit.slope + _t975(y.size - 2) * fit.stderr)


@lru_cache(maxsize=64)
def _t975(df: int) -> float:
    return stats.t.ppf(0.975, df)


def law_measures(avg_cos: np.ndarray, n_tokens: int, d_model: int) -> list[dict[str, Any]]:
    """Per trajectory, :func:`rankcollapse.metrics.rate.fit_decay_law` of the cosine gap
    ``1 - avg_cos`` ``(T+1, B)`` with the floor :func:`gap_floor`: ``law``, ``law_exponent``,
    ``law_rate``, ``law_r2_exp``, ``law_r2_power``."""
    fit = fit_decay_law(1.0 - avg_cos, floor=gap_floor(n_tokens, d_model))
    return [{"law": str(fit.law[b]), "law_exponent": float(fit.exponent[b]), "law_rate": float(fit.rate[b]),
             "law_r2_exp": float(fit.r2_exponential[b]), "law_r2_power": float(fit.r2_power[b])}
            for b in range(avg_cos.shape[1])]


def trajectory_measures(metrics: dict[str, torch.Tensor], states: list[torch.Tensor],
                        entropy: np.ndarray) -> list[dict[str, Any]]:
    """The measures of each batch element of a simulation that :func:`label_trajectory`
    reads (docs/phase.md), with the decay law (:func:`law_measures`) when ``metrics`` has
    ``avg_cos``."""
    m = metrics["mu_relative"].numpy()  # (T+1, B)
    T = m.shape[0] - 1
    w = max(1, T // 10)
    XT, Xw, X0 = states[-1], states[-1 - w], states[0]
    nT, nw, n0 = (torch.linalg.matrix_norm(X).numpy() for X in (XT, Xw, X0))
    change = torch.linalg.matrix_norm(XT / torch.as_tensor(nT)[:, None, None]
                                      - Xw / torch.as_tensor(nw)[:, None, None]).numpy()
    sv = torch.linalg.svdvals(XT)
    k = (sv > RANK_RTOL * sv[:, :1]).sum(-1).numpy()
    nr, sr = (v.numpy() for v in compute_metrics(XT, ("numerical_rank", "stable_rank")).values())  # one SVD
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
    """The regime of one trajectory: the first rule of docs/phase.md that holds."""
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
    return bool(tr.get("rate_last_bound", float("nan")) < -RATE_RESOLVED)


def _mean(values: list[float], reduce=np.mean) -> float:
    """``reduce`` (default the mean) of the finite ``values``; NaN if none."""
    v = [x for x in values if math.isfinite(x)]
    return float(reduce(v)) if v else float("nan")


def _t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval of the finite ``values`` (NaN half-width below 2 values)."""
    v = np.array([x for x in values if math.isfinite(x)])
    half = float(_t975(v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)) if v.size >= 2 else float("nan")
    mean = float(v.mean()) if v.size else float("nan")
    return mean, mean - half, mean + half


def law_cell(trajectories: list[dict[str, Any]]) -> dict[str, Any]:
    """The decay law of a cell: the majority ``law`` of its trajectories (diverged ones
    ``undecided``), medians of the finite fit measures and ``frac_law_<law>``; empty when
    the trajectories carry no law."""
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
    diverge: the marker ``MU_FLOOR`` when more than half are at or below
    ``max(floor, MU_FLOOR)`` (``floor``: :func:`mu_floor`), else the geometric mean of those
    above it; ``frac_mu_floor`` the fraction at the floor."""
    if not mus:
        return {"mu_relative": float("nan"), "frac_mu_floor": float("nan")}
    above = np.array([m for m in mus if m > max(floor, MU_FLOOR)], dtype=np.float64)
    mu = float(np.exp(np.mean(np.log(above)))) if above.size * 2 >= len(mus) else MU_FLOOR
    return {"mu_relative": mu, "frac_mu_floor": 1.0 - above.size / len(mus)}


def label_cell(trajectories: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate trajectories into a cell row (columns: docs/phase.md): means and 95%
    t-intervals of the measures, ``frac_<regime>``, the majority ``regime`` and its ``k``,
    and the decay law (:func:`law_cell`)."""
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
        **{k: _mean([t[k] for t in ok]) for k in ("numerical_rank", "stable_rank", "attention_entropy", "entropy_last")},
        "rate": rate, "rate_lo": rate_lo, "rate_hi": rate_hi,
        "rate_last": last, "rate_last_lo": last_lo, "rate_last_hi": last_hi,
        "rate_last_bound_max": _mean([t.get("rate_last_bound", float("nan")) for t in ok], max),
        "frac_rate_last_falling": sum(_tail_falling(t) for t in ok) / len(labels),
        "regime": regime,
        "k": int(np.median([t["k"] for t, lab in zip(trajectories, labels) if lab == "stable_rank_k"]))
        if regime == "stable_rank_k" else 0,
        "n_trajectories": len(labels),
    }
    row.update({f"frac_{r}": counts.get(r, 0) / len(labels) for r in REGIMES})
    row.update(law_cell(trajectories))
    return row
