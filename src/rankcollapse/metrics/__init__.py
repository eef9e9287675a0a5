"""Metrics of rank collapse and anisotropy over token matrices ``(N, d)`` / ``(B, N, d)``.

Batched, padding-aware (a padded sample gives exactly the metrics of its real rows),
with optional float64 computation. See ``docs/metrics.md`` for formulas, sources and
conventions.
"""

from typing import TYPE_CHECKING

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "_context": ("MetricContext", "RankTolerance", "ZeroRowWarning"),
    "attention": ("attention_entropy",),
    "clusters": ("CLUSTER_ANGLE", "cluster_count"),
    "core": (
        "avg_abs_cos", "avg_cos", "composite_norm", "cos_to_mean", "dong_residual",
        "dong_residual_relative", "max_token_share", "mu", "mu_relative", "norm_spread",
    ),
    "graph": ("dirichlet_energy", "mean_average_distance"),
    "isoscore": ("isoscore",),
    "registry": ("ATTENTION_METRICS", "DEFAULT_METRICS", "METRICS", "MetricSpec", "compute_metrics"),
    "report": ("MetricReport", "report_metrics"),
    "spectral": (
        "effective_rank", "numerical_rank", "rank_fraction", "rank_one_distance", "sigma_min",
        "sigma_ratio", "singular_values", "stable_rank",
    ),
})

if TYPE_CHECKING:  # the same imports, eager, for readers and static tools
    from ._context import MetricContext, RankTolerance, ZeroRowWarning
    from .attention import attention_entropy
    from .clusters import CLUSTER_ANGLE, cluster_count
    from .core import (
        avg_abs_cos, avg_cos, composite_norm, cos_to_mean, dong_residual, dong_residual_relative,
        max_token_share, mu, mu_relative, norm_spread,
    )
    from .graph import dirichlet_energy, mean_average_distance
    from .isoscore import isoscore
    from .registry import ATTENTION_METRICS, DEFAULT_METRICS, METRICS, MetricSpec, compute_metrics
    from .report import MetricReport, report_metrics
    from .spectral import (
        effective_rank, numerical_rank, rank_fraction, rank_one_distance, sigma_min, sigma_ratio,
        singular_values, stable_rank,
    )
