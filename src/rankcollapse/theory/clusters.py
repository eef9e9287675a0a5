"""Metastable clusters on the circle (docs/theory.md §9): the linearised flow's fastest Fourier
mode ``argmax_k k^2 I_k(β)`` (Bruno et al., ICLR 2025) against the measured plateaus of
:func:`~rankcollapse.metrics.cluster_count` under the flow ``x <- sphere(x/h + A x)`` with
``W_Q = W_K = W_V = I`` (``BlockConfig(norm="sphere", placement="post_ln", alpha=1/h)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._validate import check_float, check_int
from ..errors import ConfigError

#: Layers a cluster count must hold to be a plateau (10 time units at the default step 0.1).
MIN_PLATEAU = 100
#: The range of ``beta`` (the flow runs with ``d_qk = 1 / beta^2``, which must stay a normal float64).
BETA_MIN, BETA_MAX = 1e-150, 1e150


def fastest_mode(beta: float, k_max: int = 64) -> int:
    """``argmax_{1 <= k <= k_max} k^2 I_k(beta)`` (with the scaled Bessel function ``ive``).
    Raises :class:`ConfigError` for ``beta`` not positive and finite, or the maximum at ``k_max``."""
    from scipy.special import ive

    beta = check_float(beta, "beta", low=0, strict_low=True)
    k = np.arange(1, check_int(k_max, "k_max", low=2) + 1)
    best = int(k[np.argmax(k.astype(float) ** 2 * ive(k, beta))])
    if best == k_max:
        raise ConfigError(f"k^2 I_k({beta}) still grows at k_max = {k_max}: raise k_max")
    return best


def plateaus(counts, min_length: int = 1) -> list[tuple[int, int, int]]:
    """Runs of equal ``counts`` (one per layer) of at least ``min_length`` layers: ``(count, start, length)``."""
    out: list[tuple[int, int, int]] = []
    start = 0
    try:
        values = [int(c) for c in counts]
    except (TypeError, ValueError):
        raise ConfigError(f"counts must be a sequence of integers (one per layer), got {type(counts).__name__}"
                          ) from None
    for t in range(1, len(values) + 1):
        if t == len(values) or values[t] != values[start]:
            if t - start >= min_length:
                out.append((values[start], start, t - start))
            start = t
    return out


def first_plateau(counts, min_length: int = MIN_PLATEAU) -> tuple[int, int, int] | None:
    """The first run of at least ``min_length`` layers with one count (the first metastable state), or None."""
    runs = plateaus(counts, min_length)
    return runs[0] if runs else None


@dataclass
class CircleClusters:
    """Result of :func:`circle_clusters` for one ``beta``: ``predicted`` (:func:`fastest_mode`),
    ``counts`` ``(depth + 1, n_samples)``, per start the ``first`` plateau or None;
    ``agreement``: fraction of starts whose first plateau has the predicted count."""

    beta: float
    predicted: int
    counts: np.ndarray
    first: list
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def plateau_counts(self) -> list[int]:
        return [-1 if p is None else p[0] for p in self.first]

    @property
    def agreement(self) -> float:
        return float(np.mean([c == self.predicted for c in self.plateau_counts]))

    @property
    def n_plateaus(self) -> int:
        return sum(c >= 0 for c in self.plateau_counts)

    def __repr__(self) -> str:  # the counts array is (depth + 1, n_samples): leave it out
        return (f"CircleClusters(beta={self.beta:g}, predicted={self.predicted}, agreement={self.agreement:.2f}, "
                f"plateau_counts={self.plateau_counts})")

    def to_dict(self) -> dict[str, Any]:
        return {"beta": self.beta, "predicted": self.predicted, "agreement": self.agreement,
                "n_plateaus": self.n_plateaus, "plateau_counts": self.plateau_counts,
                "first_plateaus": [None if p is None else {"count": p[0], "start": p[1], "length": p[2]}
                                   for p in self.first], **self.settings}


def check_beta(beta: Any) -> float:
    """``beta`` as a float in ``[BETA_MIN, BETA_MAX]``; :class:`ConfigError` otherwise."""
    return check_float(beta, "beta", low=BETA_MIN, high=BETA_MAX)


def circle_clusters(beta: float, *, n_tokens: int = 128, n_samples: int = 20, step: float = 0.1, depth: int = 1500,
                    angle: float | None = None, min_plateau: int = MIN_PLATEAU, seed: int = 0) -> CircleClusters:
    """Run the flow on the circle from ``n_samples`` uniform random starts and compare each
    start's first plateau with :func:`fastest_mode`: scores ``beta <x_i, x_j>`` (``d_qk = 1 / beta^2``),
    Euler ``step`` ``h`` (``alpha = 1/h``), cluster ``angle`` in ``(0, pi]`` (default
    :data:`rankcollapse.metrics.CLUSTER_ANGLE`), plateaus of ``min_plateau`` layers in ``[1, depth + 1]``.
    Raises :class:`ConfigError` for a setting out of range.
    """
    import torch

    from ..dynamics import BlockConfig, RunConfig, simulate
    from ..dynamics.inputs import seeded_generator
    from ..metrics.core import CLUSTER_ANGLE, cluster_count

    beta = check_beta(beta)
    step = check_float(step, "step", low=0, strict_low=True)
    n_tokens, n_samples, depth = (check_int(v, name, low=1) for v, name in
                                  ((n_tokens, "n_tokens"), (n_samples, "n_samples"), (depth, "depth")))
    min_plateau = check_int(min_plateau, "min_plateau", low=1, high=depth + 1)
    angle = CLUSTER_ANGLE if angle is None else check_float(angle, "angle", low=0, strict_low=True, high=math.pi)
    g = seeded_generator(seed)
    theta = torch.rand(n_samples, n_tokens, generator=g, dtype=torch.float64) * (2 * math.pi)
    X0 = torch.stack([theta.cos(), theta.sin()], dim=-1)  # (n_samples, N, 2), uniform on the circle
    eye = torch.eye(2, dtype=torch.float64)
    block = BlockConfig(norm="sphere", placement="post_ln", alpha=1.0 / step)
    res = simulate(X0, mask="complete", d_qk=1.0 / beta**2, value=eye, query_key=eye,
                   metrics={"n_clusters": lambda X: cluster_count(X, angle=angle)}, block=block,
                   run=RunConfig(depth=depth, dtype=torch.float64, record_states=True))
    counts = res.metrics["n_clusters"].numpy().astype(int)  # (depth + 1, n_samples)
    first = [first_plateau(counts[:, b], min_plateau) for b in range(n_samples)]
    settings = {"n_tokens": n_tokens, "n_samples": n_samples, "seed": seed, "step": step, "depth": depth, "angle": angle,
                "min_plateau": min_plateau}
    return CircleClusters(beta=beta, predicted=fastest_mode(beta), counts=counts, first=first, settings=settings)


__all__ = ["CircleClusters", "MIN_PLATEAU", "circle_clusters", "fastest_mode", "first_plateau", "plateaus"]
