"""The regime label of a phase cell and the theory's prediction for it.

The rule (docs/phase.md; thresholds fixed before any sweep was run, never tuned):

Per trajectory (one input under one weight draw), after ``T`` layers, with
``m(t) = mu(X(t)) / ||X(t)||_F`` and ``Y(t) = X(t) / ||X(t)||_F``:

1. ``diverging``: X overflowed, or ``||X(T)||_F / ||X(0)||_F > DIVERGE_RATIO``;
2. ``rank_collapse``: ``m(T) < COLLAPSED``;
3. ``stable_rank_k``: ``||Y(T) - Y(T - w)||_F < CONVERGED`` with ``w = max(1, T // 10)``
   and ``m(T) >= ALIVE``; ``k = #{sigma_i(X(T)) > RANK_RTOL sigma_1}``;
4. ``entropy_collapse``: the mean normalised attention row entropy over the last
   ``max(1, T // 4)`` layers is ``>= UNIFORM`` (uniform) or ``<= ONE_HOT`` (one-hot);
5. ``undecided`` otherwise (still moving, or ``COLLAPSED <= m(T) < ALIVE``).

A cell's label is the label of more than half of its trajectories, else ``undecided``.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import torch
from scipy import stats

COLLAPSED = 1e-6
ALIVE = 1e-3
CONVERGED = 1e-4
RANK_RTOL = 1e-4
UNIFORM = 0.95
ONE_HOT = 0.05
DIVERGE_RATIO = 1e12
RATE_FLOOR = 1e-12  # m(t) below this is float64 round-off: excluded from the rate fit
REGIMES = ("rank_collapse", "entropy_collapse", "stable_rank_k", "diverging", "undecided")


def fit_log10_rate(m: np.ndarray) -> float:
    """Least-squares slope of ``log10 m(t)`` against ``t`` over the layers before ``m``
    first drops below :data:`RATE_FLOOR` (decades per layer; negative = collapsing).
    NaN with fewer than two usable layers."""
    below = np.nonzero(~(m >= RATE_FLOOR))[0]
    stop = int(below[0]) if below.size else m.size
    if stop < 2:
        return float("nan") if stop < 1 or below.size == 0 else float(np.log10(RATE_FLOOR) - np.log10(m[0]))
    t = np.arange(stop, dtype=np.float64)
    return float(np.polyfit(t, np.log10(m[:stop]), 1)[0])


def trajectory_measures(metrics: dict[str, torch.Tensor], states: list[torch.Tensor],
                        entropy: np.ndarray) -> list[dict[str, Any]]:
    """One dict per batch element of a simulation: ``mu_relative`` (final), ``norm_ratio``,
    ``change`` (of the normalised state over the last ``w`` layers), ``numerical_rank``,
    ``stable_rank``, ``k``, ``rate``, ``attention_entropy`` (mean over layers whose input
    had ``m >= ALIVE``, else layer 1) and ``entropy_last`` (last quarter of layers)."""
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
    out = []
    for b in range(m.shape[1]):
        alive = m[:-1, b] >= ALIVE  # input of layer t+1 not yet collapsed
        ent = float(entropy[alive, b].mean()) if alive.any() else float(entropy[0, b])
        out.append({"diverged": False, "mu_relative": float(m[-1, b]), "norm_ratio": float(nT[b] / n0[b]),
                    "change": float(change[b]), "k": int(k[b]), "numerical_rank": float(nr[b]),
                    "stable_rank": float(sr[b]), "rate": fit_log10_rate(m[:, b]), "attention_entropy": ent,
                    "entropy_last": float(entropy[-max(1, T // 4):, b].mean())})
    return out


def label_trajectory(tr: dict[str, Any]) -> str:
    """The regime of one trajectory (module docstring's rule)."""
    if tr["diverged"] or not tr["norm_ratio"] <= DIVERGE_RATIO:
        return "diverging"
    if tr["mu_relative"] < COLLAPSED:
        return "rank_collapse"
    if tr["change"] < CONVERGED and tr["mu_relative"] >= ALIVE:
        return "stable_rank_k"
    if tr["entropy_last"] >= UNIFORM or tr["entropy_last"] <= ONE_HOT:
        return "entropy_collapse"
    return "undecided"


def _mean(values: list[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")


def label_cell(trajectories: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate trajectories into a cell row: means of the measures (``mu_relative`` as a
    geometric mean), the rate's mean and 95% t-interval over trajectories, the per-regime
    fractions, the majority ``regime`` and its ``k`` (median over its trajectories)."""
    labels = [label_trajectory(t) for t in trajectories]
    counts = Counter(labels)
    top, n_top = counts.most_common(1)[0]
    regime = top if n_top * 2 > len(labels) else "undecided"
    ok = [t for t in trajectories if not t["diverged"]]
    rates = np.array([t["rate"] for t in ok if math.isfinite(t["rate"])])
    if rates.size >= 2:
        half = float(stats.t.ppf(0.975, rates.size - 1) * rates.std(ddof=1) / math.sqrt(rates.size))
    else:
        half = float("nan")
    rate = float(rates.mean()) if rates.size else float("nan")
    mus = [max(t["mu_relative"], 1e-300) for t in ok]
    row = {
        "mu_relative": float(np.exp(np.mean(np.log(mus)))) if mus else float("nan"),
        "numerical_rank": _mean([t["numerical_rank"] for t in ok]),
        "stable_rank": _mean([t["stable_rank"] for t in ok]),
        "attention_entropy": _mean([t["attention_entropy"] for t in ok]),
        "entropy_last": _mean([t["entropy_last"] for t in ok]),
        "rate": rate, "rate_lo": rate - half, "rate_hi": rate + half,
        "regime": regime,
        "k": int(np.median([t["k"] for t, lab in zip(trajectories, labels) if lab == "stable_rank_k"]))
        if regime == "stable_rank_k" else 0,
        "n_trajectories": len(labels),
    }
    row.update({f"frac_{r}": counts.get(r, 0) / len(labels) for r in REGIMES})
    return row


def theory_prediction(cell: dict[str, Any], info: Any, epsilon_min: float,
                      value_log_norm: float = 0.0) -> dict[str, Any]:
    """What the paper's theorems say about ``cell`` (docs/phase.md), as
    ``theory_regime`` (``""`` = no prediction), ``theory_source`` and ``theory_rate``
    (Theorem 1's per-layer log10 envelope factor from the mask radius and the smallest
    attention entry seen, or NaN).

    - Theorem 1 (pure SA: no norm, no skip, quasi-strongly connected mask, and its
      assumption A2 checked as ``value_log_norm = sum_t ln ||W_V(t)||_2 <= 1e-9``, round-off of orthogonal W_V):
      ``rank_collapse``. Pure-SA cells that fail A2 get no prediction and
      ``theory_source = "pure_sa_outside_A2"`` (so the naive reading can be scored too).
    - Theorem 2 (unit-sphere norm, no skip, orthogonal ``W_V``, tokens in an open
      hemisphere, quasi-strongly connected mask): ``rank_collapse``.
    - Equilibria (unit-sphere norm, no skip, the constructed ``W_V``, ``W_Q = W_K = 0``,
      causal mask): stable equilibria of rank ``min(d, N)`` exist: ``stable_rank_k``.
    """
    from ..masks.rates import log_contraction

    no_skip = not cell["skip"] and cell["placement"] == "post"
    regime, source, rate = "", "", float("nan")
    if no_skip and cell["norm"] == "none" and info.quasi_strongly_connected and value_log_norm > 1e-9:
        source = "pure_sa_outside_A2"
    elif no_skip and cell["norm"] == "none" and info.quasi_strongly_connected:
        regime, source = "rank_collapse", "theorem1"
        if 0 < epsilon_min < 1 and info.radius:
            rate = log_contraction(epsilon_min, max(1, int(info.radius))) / math.log(10)
    elif (no_skip and cell["norm"] == "sphere" and cell["value"] == "orthogonal" and cell["input"] == "hemisphere"
          and info.quasi_strongly_connected):
        regime, source = "rank_collapse", "theorem2"
    elif (no_skip and cell["norm"] == "sphere" and cell["value"] == "constructed" and cell["qk_scale"] == 0
          and cell["mask"] == "causal"):
        regime, source = "stable_rank_k", "equilibria"
    return {"theory_regime": regime, "theory_source": source, "theory_rate": rate}
