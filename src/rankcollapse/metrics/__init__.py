"""Metrics of rank collapse and anisotropy over token matrices ``(N, d)`` / ``(B, N, d)``:
batched and padding-aware (docs/metrics.md: formulas, sources, conventions).
"""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, imported lazily on first use (attach_imports reads this block).
if TYPE_CHECKING:
    from ._context import MetricContext, ZeroRowWarning
    from .attention import attention_entropy, gap_counting, gap_growth, participation_ratio, row_mass_deficit
    from .core import (CLUSTER_ANGLE, avg_abs_cos, avg_cos, cluster_count, composite_norm, cos_to_mean,
                       dirichlet_energy, dong_residual, dong_residual_relative, interaction_energy, max_token_share,
                       mean_average_distance, mu, mu_relative, norm_spread)
    from .registry import (ATTENTION_METRICS, DEFAULT_METRICS, METRICS, STEP_METRICS, WEIGHT_METRICS, MetricReport,
                           MetricSpec, compute_metrics, register_metric, report_metrics)
    from .power import principal_eigenvector, spectral_radius, v1_alignment, value_output_map
    from .spectral import (alpha_req, angular_speed, effective_rank, isoscore, matrix_entropy, max_norm_position,
                           max_norm_ratio, max_token_sigma_share, numerical_rank, rank_fraction, rank_one_distance,
                           sigma_min, sigma_ratio, singular_values, stable_rank, top_singular_share)

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
