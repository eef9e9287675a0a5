"""A measured pure-SA run against its Theorem-1 envelope (docs/theory.md §1, §7): the pieces
:func:`~.bound.check_collapse_bound` and :func:`~.schedule_bound.check_schedule_bound` share."""

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
from .envelope import check_exponent, measured_envelope
from ..metrics.rate import least_squares_rate
from ..summary import by_layer, summary_table


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
