"""What the theory says about a phase cell (docs/phase.md, "Theory's prediction per cell"),
and Theorem 1's envelope checked on its trajectories at every layer (docs/theory.md §1).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
import torch

#: Sign patterns of the construction whose stability the equilibria prediction reads
#: (docs/theory.md §3b: every pattern has the same k(k-1)/2 unstable directions).
STABILITY_PATTERNS = 4
#: A2 (products of W_V bounded by 1) holds when ``value_log_norm`` is at most this (round-off of orthogonal W_V).
A2_TOL = 1e-9
#: Relative slack of the pointwise envelope comparison (float64 round-off of μ and of the envelope).
ENVELOPE_RTOL = 1e-9


@lru_cache(maxsize=16)
def constructed_stability(n_tokens: int, d_model: int) -> dict[str, Any]:
    """Stability of the rank-``min(N, d)`` equilibria of the ``constructed`` W_V (first
    :data:`STABILITY_PATTERNS` sign patterns) and of the consensus at its top eigenvector:
    ``rank``, ``n_checked``, ``n_stable``, ``n_unstable_directions`` (of the first) and
    ``consensus_stable``."""
    from ..theory.equilibria import construction_eigenvalues, equilibria
    from ..theory.stability import stability

    rank = min(n_tokens, d_model)
    es = equilibria(n_tokens, d_model, rank, limit=STABILITY_PATTERNS)
    lam = construction_eigenvalues(d_model, rank)
    consensus = torch.zeros(n_tokens, d_model, dtype=torch.float64)
    consensus[:, int(np.argmax(lam))] = 1.0
    return {"rank": rank, "n_checked": len(es.equilibria), "n_stable": sum(bool(e.stable) for e in es.equilibria),
            "n_unstable_directions": es.equilibria[0].stability.n_unstable,
            "consensus_stable": bool(stability(es.system, consensus).stable)}


def theory_prediction(cell: dict[str, Any], info: Any, epsilon_measured: float,
                      value_log_norm: float = 0.0) -> dict[str, Any]:
    """What the paper's results say about ``cell`` (docs/phase.md): ``theory_regime`` (``""``:
    no prediction), ``theory_source`` (``theorem1``, ``theorem2``, ``equilibria``, or why
    none: ``pure_sa_outside_A2``, ``not_row_stochastic``, ``headwise_rmsnorm``) and
    ``theory_rate`` (Theorem 1's per-layer log10 envelope factor, or NaN)."""
    from ..theory.envelope import log_contraction
    from .grid import cell_beta

    no_skip = cell["placement"] == "none"  # X <- norm(SA(X)): no residual (alpha 0)
    regime, source, rate = "", "", float("nan")
    qsc = info.quasi_strongly_connected and info.self_loops
    if cell.get("attention", "softmax") != "softmax":  # every result below assumes row-stochastic softmax rows
        source = "not_row_stochastic"
    elif cell.get("headwise_rmsnorm", False) and cell["norm"] == "none":  # rows rescaled: not a convex mixing
        source = "headwise_rmsnorm"
    elif no_skip and cell["norm"] == "none" and qsc and value_log_norm > A2_TOL:
        source = "pure_sa_outside_A2"
    elif no_skip and cell["norm"] == "none" and qsc:
        regime, source = "rank_collapse", "theorem1"
        if 0 < epsilon_measured < 1 and info.radius:
            rate = log_contraction(epsilon_measured, max(1, int(info.radius))) / math.log(10)
    elif (no_skip and cell["norm"] == "sphere" and cell["value"] == "orthogonal" and cell["input"] == "hemisphere"
          and qsc):
        regime, source = "rank_collapse", "theorem2"
    elif (no_skip and cell["norm"] == "sphere" and cell["value"] == "constructed"
          and (cell["qk_scale"] == 0 or cell_beta(cell) == 0)  # every score 0: uniform attention
          and cell["mask"] == "causal" and cell["value_scale"] > 0):
        st = constructed_stability(int(cell["n_tokens"]), int(cell["d_model"]))
        source = "equilibria"
        if st["n_stable"]:
            regime = "stable_rank_k"
        elif st["consensus_stable"]:
            regime = "rank_collapse"
    return {"theory_regime": regime, "theory_source": source, "theory_rate": rate}


def envelope_points(mu: np.ndarray, X0: torch.Tensor, epsilon: np.ndarray, radius: int) -> dict[str, np.ndarray]:
    """Theorem 1's envelope ``E_b(t) = C_b (1 - ε_b^r)^{t/r}``, ``C_b = (√N / 2) ‖osc(X_b(0))‖₂ /
    (1 - ε_b^r)`` (docs/theory.md §1), against μ at every layer of every trajectory; ``ε_b = 0``
    gives the constant envelope ``C_b``. ``mu`` ``(T+1, B)``, ``X0`` ``(B, N, d)``, ``epsilon``
    ``(B,)``, ``radius`` r >= 1 -> ``(B,)`` arrays ``violations`` (layers with μ above
    ``E (1 + ENVELOPE_RTOL)``) and ``log10_margin`` (max over ``t >= 1`` of log10 μ/E).
    """
    from ..theory.envelope import collapse_envelope

    T1, B = mu.shape
    N = X0.shape[1]
    osc = (X0.amax(1) - X0.amin(1)).to(torch.float64)
    t = np.arange(T1, dtype=np.float64)
    viol, margin = np.zeros(B, dtype=np.int64), np.full(B, -np.inf)
    for b in range(B):
        eps = float(epsilon[b])
        contraction = 1.0 - eps ** radius if eps > 0 else 1.0
        if contraction <= 0:  # every row has one key (ε = 1): no QSC mask with N >= 2 does this
            margin[b] = float("nan")
            continue
        C = math.sqrt(N) / 2 * float(torch.linalg.vector_norm(osc[b])) / contraction
        env = collapse_envelope(t, eps, radius, C=C) if 0 < eps < 1 else np.full(T1, C)
        viol[b] = int((mu[:, b] > env * (1 + ENVELOPE_RTOL)).sum())
        with np.errstate(divide="ignore"):
            margin[b] = float(np.max(np.log10(mu[1:, b] / env[1:]))) if T1 > 1 else -np.inf
    return {"violations": viol, "log10_margin": margin}


def envelope_applies(cell: dict[str, Any], info: Any) -> bool:
    """Theorem 1's envelope is defined for the cell: pure softmax SA (no norm, skip or
    head-wise RMSNorm) on a quasi-strongly connected mask with self-loops (A2 aside)."""
    return (cell["norm"] == "none" and cell["placement"] == "none" and cell.get("attention", "softmax") == "softmax"
            and not cell.get("headwise_rmsnorm", False)
            and bool(info.quasi_strongly_connected) and bool(info.self_loops) and cell["n_tokens"] >= 2)


def _envelope(cell, info, mu_abs, X0, eps, diverged) -> dict[str, np.ndarray] | None:
    if not envelope_applies(cell, info):
        return None
    out = envelope_points(mu_abs, X0, eps, int(info.radius))
    out["layers"] = mu_abs.shape[0]
    out["violations"] = np.where(diverged, -1, out["violations"])  # -1: not checked (overflowed)
    return out


def _envelope_columns(env: dict[str, np.ndarray] | None, part: slice) -> dict[str, float]:
    """Per cell: ``envelope_points``, ``envelope_violations``, ``envelope_log10_margin`` (NaN: no envelope)."""
    if env is None:
        return {"envelope_points": 0, "envelope_violations": float("nan"), "envelope_log10_margin": float("nan")}
    v, m = env["violations"][part], env["log10_margin"][part]
    ok = v >= 0
    return {"envelope_points": int(ok.sum()) * int(env["layers"]), "envelope_violations": float(v[ok].sum()),
            "envelope_log10_margin": float(m[ok].max()) if ok.any() else float("nan")}
