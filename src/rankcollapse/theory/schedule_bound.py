"""The schedule envelope (docs/theory.md §7): Theorem 1 applied to the composed graph.

For a schedule of period ``p`` whose masks all have self-loops and whose composed graph
``H = M_{p-1} ∘ ... ∘ M_0`` is QSC with radius ``r_H``, pure SA with orthogonal
``W_V(t)`` and every allowed entry ``≥ ε`` satisfies

``μ(X(t)) ≤ C (1 - ε^{p r_H})^{t / (p r_H)}``,  ``C = (√N / 2) ‖osc(X(0))‖₂ / (1 - ε^{p r_H})``,

i.e. Theorem 1's envelope with the radius ``r`` replaced by ``p r_H``. ``ε`` is measured
on the trajectory (smallest allowed entry over all layers, each under its own mask), so a
point above the envelope is a bug. The run also checks the support claim the proof
rests on: the product of the attention matrices of one period has exactly the support of
``H`` with entries ``≥ ε^p``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ..errors import ConfigError
from ..masks import analyze
from ..masks.schedule import parse_schedule
from .bound import EXPONENTS, BoundResult, EnvelopeViolation, fit_rate, orthogonal_run


def _period_support(attention: list[torch.Tensor], p: int) -> torch.Tensor:
    """Product ``A(p-1) ... A(0)`` of the first period, ``(B, H, N, N)``."""
    P = attention[0]
    for A in attention[1:p]:
        P = A @ P
    return P


def check_schedule_bound(
    schedule: Any, *, n: int | None = None, d: int = 16, depth: int = 60, n_samples: int = 8,
    seed: int = 0, exponent: str = "t/r", d_qk: float = 1.0, qk_scale: float = 1.0,
    X0: torch.Tensor | None = None,
) -> BoundResult:
    """Run pure SA through ``schedule`` (Haar ``W_V`` per layer) and check its envelope.

    Same parameters and trajectory as :func:`~rankcollapse.theory.check_collapse_bound`
    (``simulate(X0, mask=schedule, value="orthogonal", query_key=..., seed=seed,
    dtype=float64)``); ``radius`` of the result is the composed graph's ``r_H``, and
    ``config`` adds ``period``, ``effective_radius`` (``p r_H``) and ``support_agrees``
    (the first period's attention product has exactly the composed support, entries
    ``≥ ε^p``; checked when ``depth ≥ p``).

    Raises
    ------
    ConfigError
        Unknown exponent, fewer than 2 tokens, ``depth``/``n_samples``/``d`` < 1, a
        composed graph that is not QSC, a layer mask without self-loops, bad ``X0``.
    MaskError
        A bad schedule spec.
    """
    if exponent not in EXPONENTS:
        raise ConfigError(f"exponent must be one of {EXPONENTS}, got {exponent!r}")
    if depth < 1 or n_samples < 1 or d < 1:
        raise ConfigError(f"need depth ≥ 1, n_samples ≥ 1, d ≥ 1; got {depth}, {n_samples}, {d}")
    if n is None:
        raise ConfigError("a schedule needs the number of tokens n")
    sched = parse_schedule(schedule, n)
    N, p = sched.n_tokens, sched.period
    if N < 2:
        raise ConfigError(f"the envelope needs at least 2 tokens, got N={N}")
    if not all(bool(m.to_csr().diagonal().all()) for m in sched.masks):
        raise ConfigError(f"schedule {sched.spec!r} has a layer mask without self-loops: the proof needs them")
    H = sched.composed()
    info = analyze(H)
    if not info.quasi_strongly_connected:
        raise ConfigError(f"schedule {sched.spec!r}: composed graph is not quasi-strongly connected ({info.reason})")
    r = int(info.radius)
    X0, sim = orthogonal_run(X0, sched, N, d, n_samples=n_samples, depth=depth, d_qk=d_qk, qk_scale=qk_scale, seed=seed)
    B, _, d = X0.shape
    dense = [sched.layer(t).to_dense() for t in range(depth)]
    # ε per sample: smallest allowed entry over heads and layers, each under its own mask
    eps = torch.stack([A.masked_fill(~M, 2.0).flatten(1).amin(1)
                       for A, M in zip(sim.attention, dense)]).amin(0).clamp_max(1.0)
    support_agrees = None
    if depth >= p:
        P = _period_support(sim.attention, p)
        Hd = H.to_dense()
        floor = (eps**p).view(B, 1, 1, 1) * (1 - 1e-9)
        support_agrees = bool(((P > 0) == Hd).all() and (P.masked_fill(~Hd, 2.0) >= floor).all())
    k = 1 if exponent == "t/r" else 2
    pr = p * r
    mu_t = sim.metrics["mu"]
    contraction = 1 - eps**pr
    osc = (X0.amax(1) - X0.amin(1)).to(torch.float64)
    C = math.sqrt(N) / 2 * torch.linalg.vector_norm(osc, dim=1) / contraction
    power = torch.arange(depth + 1, dtype=torch.float64).unsqueeze(1) / (k * pr)
    envelope = C * contraction**power
    n_bad = int((mu_t > envelope * (1 + 1e-9) + 1e-300).sum())
    if n_bad:
        warnings.warn(f"schedule envelope violated at {n_bad} (layer, sample) points for {sched.spec!r}",
                      EnvelopeViolation, stacklevel=2)
    cfg = {"n": N, "d": d, "depth": depth, "n_samples": B, "seed": seed, "d_qk": d_qk, "qk_scale": qk_scale,
           "value": "orthogonal", "query_key": sim.config["query_key"], "period": p, "effective_radius": pr,
           "support_agrees": support_agrees}
    return BoundResult(sched.spec, r, exponent, mu_t, envelope, eps, float(fit_rate(mu_t).median()),
                       float((contraction ** (1 / (k * pr))).median()), n_bad, cfg)
