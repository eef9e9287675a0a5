"""Theorem 1 (spec.md §5.1) checked against measurement: masked pure SA collapses.

Envelope (proof in docs/spec.md § "Theorem 1: a rigorous envelope"): with orthogonal
``W_V(t)``, every allowed attention entry ``≥ ε`` along the trajectory, self-loops, and
a QSC mask of radius ``r``,
``μ(X(t)) ≤ C (1 - ε^r)^{t/r}``, ``C = (√N / 2) ‖osc(X(0))‖_2 / (1 - ε^r) ≤ √N μ(X(0)) / (1 - ε^r)``,
where ``osc`` is the per-column max minus min. The weaker exponent ``t/(2r)`` (a
possible reading of the paper) is a parameter. ``ε`` is measured on the same
trajectory, so a measured point above its envelope is a bug (or a counterexample).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from .._deprecation import renamed_arguments, renamed_attribute
from .._display import NotebookResult
from ..dynamics import gaussian_tokens, simulate
from ..errors import ConfigError
from ..masks import resolve_mask
from ..masks.schedule import is_schedule
from .envelope import EXPONENTS, measured_envelope, require_theorem1


class EnvelopeViolation(UserWarning):
    """A measured μ(X(t)) above its Theorem 1 envelope."""


@dataclass
class BoundResult(NotebookResult):
    """Measured μ and the Theorem 1 envelope, per layer and sample.

    ``mu`` and ``envelope`` are float64 ``(depth+1, B)``; ``epsilon_measured`` ``(B,)``, the
    smallest allowed attention entry each sample's trajectory met (:func:`measured_epsilon`;
    the deprecated ``epsilon`` reads it);
    ``measured_rate`` is the median over samples of ``exp(slope)`` of a least-squares fit
    of ``log μ(t)`` (per-layer decay factor, < 1 = collapse); ``envelope_rate`` is
    ``(1 - ε^e)^{1/e}`` (or ``^{1/(2e)}``, ``e`` the effective radius, ``r`` for a mask) of
    the sample whose ε is the median (``torch.median``: the lower middle for an even count),
    so that ``epsilon_measured_median`` and ``envelope_rate`` describe one and the same sample.
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

    epsilon = renamed_attribute("epsilon", "epsilon_measured")

    @property
    def holds(self) -> bool:
        return self.n_violations == 0

    def table(self) -> pd.DataFrame:
        """Tidy table: ``layer, sample, mu, envelope``."""
        T, B = self.mu.shape
        return pd.DataFrame({
            "layer": np.repeat(np.arange(T), B), "sample": np.tile(np.arange(B), T),
            "mu": self.mu.flatten().numpy(), "envelope": self.envelope.flatten().numpy(),
        })

    def to_pandas(self, *, summary: bool = False) -> pd.DataFrame:
        """The tidy table of :meth:`table`; with ``summary``, that of :meth:`summarise`."""
        return self.summarise() if summary else self.table()

    def summarise(self) -> pd.DataFrame:
        """Statistics over samples of ``mu`` and ``envelope`` per layer, in the
        results-table layout of :mod:`rankcollapse.summary` (metrics ``mu``, ``envelope``)."""
        from ..summary import by_layer, summary_table

        return summary_table(by_layer({"mu": self.mu, "envelope": self.envelope}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "mask": self.mask, "radius": self.radius, "exponent": self.exponent,
            "epsilon_measured_median": float(self.epsilon_measured.median()), "measured_rate": self.measured_rate,
            "envelope_rate": self.envelope_rate, "n_violations": self.n_violations, "holds": self.holds,
            "mu_median": self.mu.median(dim=1).values.tolist(),
            "envelope_median": self.envelope.median(dim=1).values.tolist(), "config": self.config,
        }


def fit_rate(mu: torch.Tensor, floor: float = 1e-12) -> torch.Tensor:
    """Per-sample ``exp(slope)`` of least-squares ``log μ(t)`` vs ``t`` over layers with
    ``μ(t) > floor · μ(0)``. ``mu`` ``(T, B)`` → ``(B,)``.

    Raises ConfigError when ``mu`` is not ``(T, B)`` with ``T >= 2`` (a slope needs two
    layers) and ``B >= 1``."""
    if getattr(mu, "ndim", None) != 2 or mu.shape[0] < 2 or mu.shape[1] < 1:
        raise ConfigError(f"fit_rate needs mu of shape (T, B) with T >= 2 layers and B >= 1, "
                          f"got {tuple(getattr(mu, 'shape', ())) or type(mu).__name__}")
    T = mu.shape[0]
    t = torch.arange(T, dtype=torch.float64).unsqueeze(1).expand_as(mu)
    keep = (mu > floor * mu[:1]) & (mu > 1e-280)
    w = keep.double()
    n = w.sum(0).clamp_min(1)
    y = torch.where(keep, mu.clamp_min(1e-300).log(), torch.zeros_like(mu))
    tm, ym = (w * t).sum(0) / n, (w * y).sum(0) / n
    slope = (w * (t - tm) * (y - ym)).sum(0) / (w * (t - tm) ** 2).sum(0).clamp_min(1e-300)
    return slope.exp()


def measured_epsilon(attention: list[torch.Tensor], layer_masks: list[torch.Tensor]) -> torch.Tensor:
    """ε per sample: the smallest allowed attention entry over heads and layers, each layer
    under its own bool ``(N, N)`` mask (``attention[t]`` is ``(B, H, N, N)``); ``(B,)``
    float64, at most 1."""
    return torch.stack([A.masked_fill(~M, 2.0).flatten(1).amin(1)
                        for A, M in zip(attention, layer_masks)]).amin(0).clamp_max(1.0)


def envelope_result(spec: str, radius: int, effective_radius: int, exponent: str, X0: torch.Tensor,
                    mu: torch.Tensor, epsilon: torch.Tensor, config: dict[str, Any]) -> BoundResult:
    """:class:`BoundResult` of a measured run: the envelope of exponent ``effective_radius``
    (:func:`~rankcollapse.theory.envelope.measured_envelope`) against ``mu`` ``(T, B)``,
    the points above it counted (and warned about with :class:`EnvelopeViolation`), and
    ``envelope_rate`` read at the median-ε sample."""
    envelope, rate = measured_envelope(X0, epsilon, effective_radius, mu.shape[0] - 1, exponent=exponent)
    n_bad = int((mu > envelope * (1 + 1e-9) + 1e-300).sum())
    if n_bad:
        warnings.warn(f"Theorem 1 envelope violated at {n_bad} (layer, sample) points for {spec!r}",
                      EnvelopeViolation, stacklevel=3)
    median = int(epsilon.median(dim=0).indices)  # the lower middle, the sample epsilon_measured_median reports
    return BoundResult(spec, radius, exponent, mu, envelope, epsilon, float(fit_rate(mu).median()),
                       float(rate[median]), n_bad, config)


def orthogonal_run(X0, mask: Any, N: int, d: int, *, n_samples: int, depth: int, d_qk: float, qk_scale: float,
                   seed: int):
    """The pure-SA run both envelope checks measure: ``X0`` (default Gaussian tokens,
    std ``1/sqrt(d)``) through ``depth`` layers of :func:`simulate` with Haar-orthogonal
    ``W_V`` (so assumption A2 holds), Gaussian ``W_Q, W_K`` scaled by ``qk_scale``,
    float64, attention recorded. Returns ``(X0 (B, N, d) float64, SimResult)``.

    Raises
    ------
    ConfigError
        ``X0`` not of shape ``(B, N, d)``.
    """
    if X0 is None:
        X0 = gaussian_tokens(n_samples, N, d, seed=seed, std=1 / math.sqrt(d))
    X0 = torch.as_tensor(X0).to(torch.float64)
    if X0.ndim != 3 or X0.shape[1] != N:
        raise ConfigError(f"X0 must be (B, {N}, d), got {tuple(X0.shape)}")
    d = X0.shape[2]
    query_key = "gaussian" if qk_scale == 1 else f"gaussian:std={qk_scale / math.sqrt(d)}"
    sim = simulate(X0, mask=mask, depth=depth, d_qk=d_qk, value="orthogonal", query_key=query_key, seed=seed,
                   dtype=torch.float64, metrics=("mu",), path="dense", record_attention=True)
    return X0, sim


@renamed_arguments(n="n_tokens", d="d_model")
def check_collapse_bound(
    mask: Any,
    *,
    n_tokens: int | None = None,
    d_model: int = 16,
    depth: int = 60,
    n_samples: int = 8,
    seed: int = 0,
    exponent: str = "t/r",
    d_qk: float = 1.0,
    qk_scale: float = 1.0,
    X0: torch.Tensor | None = None,
) -> BoundResult:
    """Run pure SA with per-layer Haar-orthogonal ``W_V`` and check Theorem 1's envelope.

    The trajectory is :func:`rankcollapse.dynamics.simulate`'s, so every curve is
    reproducible through it with the same seed::

        X0 = gaussian_tokens(n_samples, N, d, seed=seed, std=1 / sqrt(d))
        simulate(X0, mask=mask, depth=depth, d_qk=d_qk, value="orthogonal",
                 query_key=result.config["query_key"], seed=seed,
                 dtype=torch.float64).metrics["mu"]  # == result.mu

    (``query_key`` is ``"gaussian"`` for ``qk_scale=1``, else ``"gaussian:std=…"``).

    Parameters
    ----------
    mask : Mask, bool ``(N, N)`` or spec string (with ``n_tokens``); must be QSC with
        self-loops. A schedule (``"schedule:..."``) is checked against its own envelope by
        :func:`~rankcollapse.theory.schedule_bound.check_schedule_bound`.
    n_tokens : number of tokens N of a spec string (deprecated alias ``n``).
    d_model, depth, n_samples, seed : width d (deprecated alias ``d``), layers, batch size
        and seed (weights, and X(0) unless given).
    exponent : ``"t/r"`` or ``"t/(2r)"``.
    d_qk, qk_scale : temperature, and std·√d of the Gaussian ``W_Q, W_K`` entries (A1).
    X0 : optional ``(B, N, d)`` inputs; default Gaussian with entries of std ``1/√d``.

    Returns
    -------
    BoundResult
        A measured point above the envelope also emits an :class:`EnvelopeViolation` warning.

    Raises
    ------
    ConfigError
        Unknown exponent, fewer than 2 tokens, ``depth``/``n_samples``/``d_model`` < 1, a mask
        that is not QSC or lacks self-loops, ``X0`` of the wrong shape.
    MaskError
        A spec without ``n_tokens``, or an invalid mask.
    """
    if is_schedule(mask):  # per-layer masks: the envelope of the composed graph (docs/theory.md §7)
        from .schedule_bound import check_schedule_bound

        return check_schedule_bound(mask, n_tokens=n_tokens, d_model=d_model, depth=depth, n_samples=n_samples, seed=seed,
                                    exponent=exponent, d_qk=d_qk, qk_scale=qk_scale, X0=X0)
    if exponent not in EXPONENTS:
        raise ConfigError(f"exponent must be one of {tuple(EXPONENTS)}, got {exponent!r}")
    if depth < 1 or n_samples < 1 or d_model < 1:
        raise ConfigError(f"need depth ≥ 1, n_samples ≥ 1 and d_model ≥ 1; got depth={depth}, "
                          f"n_samples={n_samples}, d_model={d_model}")
    m = resolve_mask(mask, n_tokens)
    terms = require_theorem1(m)
    N, r = m.n_tokens, int(terms.radius)
    X0, sim = orthogonal_run(X0, m, N, d_model, n_samples=n_samples, depth=depth, d_qk=d_qk, qk_scale=qk_scale, seed=seed)
    eps = measured_epsilon(sim.attention, [m.dense()] * depth)
    cfg = {"n_tokens": N, "d_model": X0.shape[2], "depth": depth, "n_samples": X0.shape[0], "seed": seed, "d_qk": d_qk,
           "qk_scale": qk_scale, "value": "orthogonal", "query_key": sim.config["query_key"]}
    return envelope_result(m.spec, r, r, exponent, X0, sim.metrics["mu"], eps, cfg)


@renamed_arguments(n="n_tokens")
def radius_sweep(n_tokens: int = 32, widths: tuple[int, ...] = (32, 17, 9, 5, 3, 2), **kwargs: Any) -> pd.DataFrame:
    """Theorem 1 check across ``causal_sliding_window:w`` masks at fixed ``n_tokens``.

    Returns a table ``mask, width, radius, epsilon_measured (median over samples), measured_rate, envelope_rate,
    n_violations, holds`` (one row per width, same seed and inputs for all).
    """
    rows = []
    for w in widths:
        res = check_collapse_bound(f"causal_sliding_window:w={w}", n_tokens=n_tokens, **kwargs)
        rows.append({"mask": res.mask, "width": w, "radius": res.radius, "epsilon_measured": float(res.epsilon_measured.median()),
                     "measured_rate": res.measured_rate, "envelope_rate": res.envelope_rate,
                     "n_violations": res.n_violations, "holds": res.holds})
    return pd.DataFrame(rows)
