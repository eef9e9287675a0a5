"""The paper's theorems as code (spec.md §5; derivations in docs/theory.md): Theorem 1
(:func:`check_collapse_bound`; quantities before a run in :mod:`.envelope`), Theorem 2
(:func:`check_sphere_collapse`), SA-LN equilibria, stability and basins, temperature laws
(:func:`participation_scan`), masks and schedules by rate (:mod:`.rates`).
"""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, imported lazily on first use (attach_imports reads this block).
if TYPE_CHECKING:
    from .basin import (BasinEstimate, basin_estimate, plot_portrait_2d, plot_trajectories_3d, portrait_2d,
                        portrait_2d_data, trajectories_3d)
    from .bound import (BoundResult, EnvelopeViolation, check_collapse_bound, check_schedule_bound, fit_rate,
                        radius_sweep)
    from .clusters import CircleClusters, circle_clusters, fastest_mode, first_plateau, plateaus
    from .envelope import (EnvelopeDepth, Theorem1Terms, envelope_crossing_depth, envelope_rate,
                           scrambling_length, theorem1_terms)
    from .equilibria import (Equilibrium, EquilibriumSet, FinderResult, FinderSettings, causal_example_2x2, equilibria,
                             find_equilibria)
    from .rates import compare_masks, compare_schedules, describe_schedule
    from .sphere import SphereResult, check_sphere_collapse
    from .stability import StabilityReport, jacobian, stability, tangent_basis, tangent_jacobian
    from .system import AttentionSystem, causal_uniform_system
    from .temperature import TemperatureScan, participation_scan

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
