"""Theorem 1 (spec.md §5.1; envelope in :mod:`.envelope`) checked against measurement: ``ε`` is
measured on the same trajectory, so a point above the envelope is a bug (or a counterexample).

A schedule (docs/theory.md §7) is checked against Theorem 1 with the radius replaced by the effective
radius ``e = min(p r_H, L)``. Its run also checks the support claims the proofs rest on: one
period's attention product has exactly the support of the composed graph with entries ``≥ ε^p``,
and every window of ``L`` layers has a column with entries ``≥ ε^L``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from .._display import NotebookResult
from ..dynamics import RunConfig, gaussian_tokens, simulate
from ..errors import ConfigError
from ..masks import resolve_mask
from ..masks.schedule import is_schedule, parse_schedule
from ..metrics.rate import least_squares_rate
from ..summary import by_layer, summary_table
from .envelope import check_exponent, measured_envelope, require_theorem1

__all__ = ["BoundResult", "EnvelopeViolation", "check_collapse_bound", "check_schedule_bound", "fit_rate",
           "radius_sweep"]


def fit_rate(mu: torch.Tensor, floor: float = 1e-12) -> torch.Tensor:
    """Per-sample decay factor ``exp(b)`` ``(B,)`` of a μ trajectory ``mu`` ``(T, B)``: the
    least-squares slope of ``log μ(t)`` (:func:`rankcollapse.metrics.rate.least_squares_rate`)
    over the layers with ``μ(t) > floor · μ(0)`` and ``> 1e-280``; factor 1 with fewer than two.
    Raises ConfigError unless ``mu`` is ``(T, B)`` with ``T >= 2``, ``B >= 1``."""
    if getattr(mu, "ndim", None) != 2 or mu.shape[0] < 2 or mu.shape[1] < 1:
        raise ConfigError(f"fit_rate needs mu of shape (T, B) with T >= 2 layers and B >= 1, "
                          f"got {tuple(getattr(mu, 'shape', ())) or type(mu).__name__}")
    fit = least_squares_rate(mu, floor=(floor * mu[:1]).clamp_min(1e-280)[0])
    return torch.nan_to_num(fit.slope, nan=0.0).exp()


class EnvelopeViolation(UserWarning):
    """A measured μ(X(t)) above its Theorem 1 envelope."""


@dataclass
class BoundResult(NotebookResult):
    """Measured μ and the Theorem 1 envelope, float64 ``(depth+1, B)``; ``epsilon_measured``
    ``(B,)`` (:func:`measured_epsilon`); ``measured_rate`` the median :func:`fit_rate`;
    ``envelope_rate`` that of the median-ε sample (the lower middle, as ``epsilon_measured_median``).
    """

    mask: str
    radius: int
    exponent: str
    mu: torch.Tensor
    envelope: torch.Tensor
    epsilon_measured: torch.Tensor
    measured_rate: float
    envelope_rate: float
    n_violations: int
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        return self.n_violations == 0

    def table(self) -> pd.DataFrame:
        """Tidy table: ``layer, sample, mu, envelope``."""
        T, B = self.mu.shape
        return pd.DataFrame({"layer": np.repeat(np.arange(T), B), "sample": np.tile(np.arange(B), T),
                             "mu": self.mu.flatten().numpy(), "envelope": self.envelope.flatten().numpy()})

    def to_pandas(self, *, summary: bool = False) -> pd.DataFrame:
        """:meth:`table`, or with ``summary`` :meth:`summarise`."""
        return self.summarise() if summary else self.table()

    def summarise(self) -> pd.DataFrame:
        """Statistics over samples of ``mu`` and ``envelope`` per layer (:mod:`rankcollapse.summary` layout)."""
        return summary_table(by_layer({"mu": self.mu, "envelope": self.envelope}))

    def to_dict(self) -> dict[str, Any]:
        return {"mask": self.mask, "radius": self.radius, "exponent": self.exponent,
                "epsilon_measured_median": float(self.epsilon_measured.median()), "measured_rate": self.measured_rate,
                "envelope_rate": self.envelope_rate, "n_violations": self.n_violations, "holds": self.holds,
                "mu_median": self.mu.median(dim=1).values.tolist(),
                "envelope_median": self.envelope.median(dim=1).values.tolist(), "config": self.config}


def measured_epsilon(attention: list[torch.Tensor], layer_masks: list[torch.Tensor]) -> torch.Tensor:
    """ε per sample ``(B,)``: the smallest allowed entry of ``attention[t]`` ``(B, H, N, N)`` over
    heads and layers, each under its own bool ``(N, N)`` mask; at most 1."""
    return torch.stack([A.masked_fill(~M, 2.0).flatten(1).amin(1)
                        for A, M in zip(attention, layer_masks)]).amin(0).clamp_max(1.0)


def envelope_result(spec: str, radius: int, effective_radius: int, exponent: str, X0: torch.Tensor,
                    mu: torch.Tensor, epsilon: torch.Tensor, config: dict[str, Any]) -> BoundResult:
    """:class:`BoundResult` of ``mu`` ``(T, B)`` against the envelope of exponent ``effective_radius``;
    points above it are counted and warned about (:class:`EnvelopeViolation`)."""
    envelope, rate = measured_envelope(X0, epsilon, effective_radius, mu.shape[0] - 1, exponent=exponent)
    n_bad = int((mu > envelope * (1 + 1e-9) + 1e-300).sum())
    if n_bad:
        warnings.warn(f"Theorem 1 envelope violated at {n_bad} (layer, sample) points for {spec!r}",
                      EnvelopeViolation, stacklevel=3)
    median = int(epsilon.median(dim=0).indices)  # the lower middle, the sample epsilon_measured_median reports
    return BoundResult(spec, radius, exponent, mu, envelope, epsilon, float(fit_rate(mu).median()),
                       float(rate[median]), n_bad, config)


def check_run(exponent: str, depth: int, n_samples: int, d_model: int) -> None:
    """Refuse (ConfigError) an unknown exponent or a run without a layer, sample or width."""
    check_exponent(exponent)
    if depth < 1 or n_samples < 1 or d_model < 1:
        raise ConfigError(f"need depth ≥ 1, n_samples ≥ 1 and d_model ≥ 1; got depth={depth}, "
                          f"n_samples={n_samples}, d_model={d_model}")


def orthogonal_run(X0, mask: Any, n_tokens: int, d_model: int, *, n_samples: int, depth: int, d_qk: float,
                   qk_scale: float, seed: int):
    """``(X0, SimResult)`` of ``depth`` float64 layers of :func:`simulate` with Haar-orthogonal
    ``W_V`` and Gaussian ``W_Q, W_K`` scaled by ``qk_scale``, attention recorded; ``X0`` defaults to
    ``n_samples`` Gaussian ``(N, d_model)`` tokens of std ``1/sqrt(d)``. Raises ConfigError for
    ``X0`` not ``(B, N, d)``."""
    N = n_tokens  # the formulas' name
    if X0 is None:
        X0 = gaussian_tokens(n_samples, N, d_model, seed=seed, std=1 / math.sqrt(d_model))
    X0 = torch.as_tensor(X0).to(torch.float64)
    if X0.ndim != 3 or X0.shape[1] != N:
        raise ConfigError(f"X0 must be (B, {N}, d), got {tuple(X0.shape)}")
    d = X0.shape[2]
    query_key = "gaussian" if qk_scale == 1 else f"gaussian:std={qk_scale / math.sqrt(d)}"
    sim = simulate(X0, mask=mask, d_qk=d_qk, value="orthogonal", query_key=query_key, metrics=("mu",),
                   run=RunConfig(depth=depth, seed=seed, dtype=torch.float64, backend="dense", record_attention=True))
    return X0, sim


def check_collapse_bound(mask: Any, *, n_tokens: int | None = None, d_model: int = 16, depth: int = 60,
                         n_samples: int = 8, seed: int = 0, exponent: str = "t/r", d_qk: float = 1.0,
                         qk_scale: float = 1.0, X0: torch.Tensor | None = None) -> BoundResult:
    """Run pure SA with per-layer Haar-orthogonal ``W_V`` and check Theorem 1's envelope.

    The trajectory is that of :func:`rankcollapse.dynamics.simulate` with ``value="orthogonal"``,
    ``query_key=result.config["query_key"]`` and the same seed (:func:`orthogonal_run`).

    Parameters
    ----------
    mask : Mask, bool ``(N, N)`` or spec string (with ``n_tokens``); QSC with self-loops.
        A schedule is checked by :func:`check_schedule_bound`.
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
