"""Metrics of rank collapse and anisotropy over token matrices ``(N, d)`` / ``(B, N, d)``.

Batched, padding-aware (a padded sample gives exactly the metrics of its real rows),
with optional float64 computation. See ``docs/metrics.md`` for formulas, sources and
conventions.
"""

from ._context import MetricContext, RankTolerance, ZeroRowWarning
from .core import (
    avg_abs_cos,
    avg_cos,
    composite_norm,
    cos_to_mean,
    dong_residual,
    dong_residual_relative,
    mu,
    mu_relative,
)
from .graph import dirichlet_energy, mean_average_distance
from .isoscore import isoscore
from .registry import DEFAULT_METRICS, METRICS, MetricSpec, compute_metrics
from .spectral import (
    effective_rank,
    numerical_rank,
    rank_fraction,
    rank_one_distance,
    sigma_min,
    sigma_ratio,
    singular_values,
    stable_rank,
)

__all__ = [
    "DEFAULT_METRICS",
    "METRICS",
    "MetricContext",
    "MetricSpec",
    "RankTolerance",
    "ZeroRowWarning",
    "avg_abs_cos",
    "avg_cos",
    "composite_norm",
    "compute_metrics",
    "cos_to_mean",
    "dirichlet_energy",
    "dong_residual",
    "dong_residual_relative",
    "effective_rank",
    "isoscore",
    "mean_average_distance",
    "mu",
    "mu_relative",
    "numerical_rank",
    "rank_fraction",
    "rank_one_distance",
    "sigma_min",
    "sigma_ratio",
    "singular_values",
    "stable_rank",
]
