"""A measured pure-SA run against its Theorem-1 envelope (spec.md §5.1, docs/theory.md §1, §7).

The pieces :func:`~rankcollapse.theory.bound.check_collapse_bound` (a mask) and
:func:`~rankcollapse.theory.schedule_bound.check_schedule_bound` (a schedule) share: the
run (:func:`orthogonal_run`, Haar-orthogonal ``W_V`` so that assumption A2 holds), ε
measured on it (:func:`measured_epsilon`) and the result (:class:`BoundResult`, built by
:func:`envelope_result`), and the measured rate of a μ trajectory (:func:`fit_rate`).
Both checks import this module; ``bound`` imports ``schedule_bound`` (to dispatch a
schedule), never the reverse, so the two form no import cycle.
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
from .envelope import check_exponent, measured_envelope
from ..metrics.rate import least_squares_rate


def fit_rate(mu: torch.Tensor, floor: float = 1e-12) -> torch.Tensor:
    """Per-sample decay factor ``exp(b)`` of a μ trajectory ``mu`` ``(T, B)`` → ``(B,)``:
    :func:`rankcollapse.metrics.rate.least_squares_rate` (least squares of ``log μ(t)``
    against ``t``) over the layers with ``μ(t) > floor · μ(0)`` and ``μ(t) > 1e-280``.
    The floor is relative because μ is absolute: ``1e-12 μ(0)`` sits well above the
    float64 round-off (~1e-16 ‖X‖) of the trajectories it is used on. A sample with fewer
    than two layers above the floor gets slope 0 (factor 1), as this function always did.

    Raises ConfigError when ``mu`` is not ``(T, B)`` with ``T >= 2`` (a slope needs two
    layers) and ``B >= 1``."""
    if getattr(mu, "ndim", None) != 2 or mu.shape[0] < 2 or mu.shape[1] < 1:
        raise ConfigError(f"fit_rate needs mu of shape (T, B) with T >= 2 layers and B >= 1, "
                          f"got {tuple(getattr(mu, 'shape', ())) or type(mu).__name__}")
    fit = least_squares_rate(mu, floor=(floor * mu[:1]).clamp_min(1e-280)[0])
    return torch.nan_to_num(fit.slope, nan=0.0).exp()


class EnvelopeViolation(UserWarning):
    """A measured μ(X(t)) above its Theorem 1 envelope."""


@dataclass
class BoundResult(NotebookResult):
    """Measured μ and the Theorem 1 envelope, per layer and sample.

    ``mu`` and ``envelope`` are float64 ``(depth+1, B)``; ``epsilon_measured`` ``(B,)``, the
    smallest allowed attention entry each sample's trajectory met (:func:`measured_epsilon`);
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


def check_run(exponent: str, depth: int, n_samples: int, d_model: int) -> None:
    """Refuse an unknown envelope exponent or a run with fewer than 1 layer, sample or
    width (ConfigError), before any mask is parsed."""
    check_exponent(exponent)
    if depth < 1 or n_samples < 1 or d_model < 1:
        raise ConfigError(f"need depth ≥ 1, n_samples ≥ 1 and d_model ≥ 1; got depth={depth}, "
                          f"n_samples={n_samples}, d_model={d_model}")


def orthogonal_run(X0, mask: Any, n_tokens: int, d_model: int, *, n_samples: int, depth: int, d_qk: float,
                   qk_scale: float, seed: int):
    """The pure-SA run both envelope checks measure: ``X0`` (default: ``n_samples``
    Gaussian token matrices ``(N, d)``, ``d = d_model``, std ``1/sqrt(d)``) through
    ``depth`` layers of :func:`simulate` with Haar-orthogonal ``W_V`` (so assumption A2
    holds), Gaussian ``W_Q, W_K`` scaled by ``qk_scale``, float64, attention recorded.
    Returns ``(X0 (B, N, d) float64, SimResult)``, where ``N = n_tokens``; a given ``X0``
    sets ``d``.

    Raises
    ------
    ConfigError
        ``X0`` not of shape ``(B, N, d)``.
    """
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
