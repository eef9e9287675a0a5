"""The schedule envelope (docs/theory.md §7): Theorem 1 with the radius replaced by the effective
radius ``e = min(p r_H, L)`` (:mod:`.envelope`). The run also checks the support claims the
proofs rest on: one period's attention product has exactly the support of the composed graph
with entries ``≥ ε^p``, and every window of ``L`` layers has a column with entries ``≥ ε^L``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError
from ..masks.schedule import parse_schedule
from .envelope import require_theorem1
from .measured import BoundResult, check_run, envelope_result, measured_epsilon, orthogonal_run


def _product(attention: list[torch.Tensor], start: int, length: int) -> torch.Tensor:
    """Product ``A(start+length-1) ... A(start)`` of recorded attention, ``(B, H, N, N)``."""
    P = attention[start]
    for A in attention[start + 1:start + length]:
        P = A @ P
    return P


def _support_agrees(attention: list[torch.Tensor], H: torch.Tensor, eps: torch.Tensor, p: int) -> bool:
    """The first period's product has exactly the support of ``H``, entries ``≥ ε^p``."""
    P = _product(attention, 0, p)
    floor = (eps**p).view(-1, 1, 1, 1) * (1 - 1e-9)
    return bool(((P > 0) == H).all() and (P.masked_fill(~H, 2.0) >= floor).all())


def _scrambling_agrees(attention: list[torch.Tensor], eps: torch.Tensor, L: int, p: int) -> bool | None:
    """Every window of ``L`` layers from a phase ``< p`` has a column ``≥ ε^L`` (None: run shorter than ``L``)."""
    starts = range(min(p, len(attention) - L + 1))
    if not starts:
        return None
    floor = (eps**L).view(-1, 1, 1) * (1 - 1e-9)
    return all(bool((_product(attention, s, L).amin(dim=-2) >= floor).any(-1).all()) for s in starts)


def check_schedule_bound(schedule: Any, *, n_tokens: int | None = None, d_model: int = 16, depth: int = 60,
                         n_samples: int = 8, seed: int = 0, exponent: str = "t/r", d_qk: float = 1.0,
                         qk_scale: float = 1.0, X0: torch.Tensor | None = None) -> BoundResult:
    """Run pure SA through ``schedule`` (Haar ``W_V`` per layer) and check its envelope; parameters,
    trajectory and errors as :func:`~rankcollapse.theory.check_collapse_bound`. The result's ``radius``
    is ``r_H``; ``config`` adds ``period``, ``period_radius``, ``scrambling_length``,
    ``effective_radius`` and the module docstring's checks ``support_agrees`` (None when
    ``depth < p``) and ``scrambling_agrees`` (None when ``depth < L``).
    """
    check_run(exponent, depth, n_samples, d_model)
    if n_tokens is None:
        raise ConfigError("a schedule needs the number of tokens n_tokens")
    sched = parse_schedule(schedule, n_tokens)
    terms = require_theorem1(sched)
    N, p, L, e = sched.n_tokens, sched.period, terms.scrambling_length, terms.effective_radius
    X0, sim = orthogonal_run(X0, sched, N, d_model, n_samples=n_samples, depth=depth, d_qk=d_qk, qk_scale=qk_scale, seed=seed)
    eps = measured_epsilon(sim.attention, [sched.layer(t).to_dense() for t in range(depth)])
    support = _support_agrees(sim.attention, sched.composed().to_dense(), eps, p) if depth >= p else None
    cfg = {"n_tokens": N, "d_model": X0.shape[2], "depth": depth, "n_samples": X0.shape[0], "seed": seed, "d_qk": d_qk,
           "qk_scale": qk_scale, "value": "orthogonal", "query_key": sim.config["query_key"], "period": p,
           "period_radius": terms.period_radius, "scrambling_length": L, "effective_radius": e,
           "support_agrees": support, "scrambling_agrees": _scrambling_agrees(sim.attention, eps, L, p)}
    return envelope_result(sched.spec, int(terms.radius), e, exponent, X0, sim.metrics["mu"], eps, cfg)
