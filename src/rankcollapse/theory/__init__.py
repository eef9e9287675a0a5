"""The paper's theorems as code (spec.md §5; derivations in docs/theory.md).

- Theorem 1 (masked pure SA collapses): :func:`check_collapse_bound`, :func:`radius_sweep`;
  the envelope of a mask or schedule before a run: :func:`envelope_rate`,
  :func:`envelope_crossing_depth`; its graph terms (radius, scrambling length, effective
  radius): :func:`theorem1_terms`, :func:`scrambling_length` — every Theorem-1 quantity
  lives in :mod:`.envelope`.
- Theorem 2 (SA-LN with orthogonal W_V on the sphere): :func:`check_sphere_collapse`.
- SA-LN equilibria: :func:`causal_example_2x2`, :func:`equilibria` (≥ 2^k of rank k),
  :func:`find_equilibria`; stability: :func:`jacobian`, :func:`tangent_jacobian`,
  :func:`stability`; basins: :func:`basin_estimate`; pictures: :mod:`.portrait`.
- Temperature laws compared by the participation ratio of one attention row against N:
  :func:`participation_scan` (:mod:`.temperature`).
- Masks and schedules compared by their rates: :func:`compare_masks`,
  :func:`compare_schedules`, :func:`describe_schedule` (:mod:`.rates`).

Layering: pyproject.toml ``[tool.importlinter]``. Inside ``theory``, the measured-run pieces
(:mod:`.measured`) sit below :mod:`.bound` and :mod:`.schedule_bound`.
"""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, written once: imported lazily on first use (attach_imports reads this
# block), eagerly by readers and static tools.
if TYPE_CHECKING:
    from .basin import BasinEstimate, basin_estimate
    from .bound import BoundResult, EnvelopeViolation, check_collapse_bound, fit_rate, radius_sweep
    from .clusters import CircleClusters, circle_clusters, fastest_mode, first_plateau, plateaus
    from .envelope import (
        EnvelopeDepth, Theorem1Terms, envelope_crossing_depth, envelope_rate, scrambling_length,
        theorem1_terms,
    )
    from .equilibria import Equilibrium, EquilibriumSet, causal_example_2x2, equilibria
    from .finder import FinderResult, FinderSettings, find_equilibria
    from .portrait import (
        plot_portrait_2d, plot_trajectories_3d, portrait_2d, portrait_2d_data, trajectories_3d,
    )
    from .rates import compare_masks, compare_schedules, describe_schedule
    from .schedule_bound import check_schedule_bound
    from .sphere import SphereResult, check_sphere_collapse
    from .stability import StabilityReport, jacobian, stability, tangent_basis, tangent_jacobian
    from .system import AttentionSystem, causal_uniform_system
    from .temperature import TemperatureScan, participation_scan

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
