"""Phase diagram of self-attention dynamics: which weights, masks and norms collapse rank.

``grid`` parses axes into cells, ``cell`` runs one cell through
:func:`rankcollapse.dynamics.simulate`, ``regime`` labels it (rule in docs/phase.md),
``predict`` gives the theory's prediction and checks Theorem 1's envelope per layer,
``sweep`` runs many cells on the sweep engine (:mod:`rankcollapse.sweep`: executors,
cache, progress) and ``report`` writes the table, heatmaps and report.html. ``phase``
builds on the sweep engine; it does not import ``experiments``.
"""

from typing import TYPE_CHECKING

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "grid": ("AXES", "DEFAULTS", "parse_axis", "expand_grid"),
    "cell": ("run_cell",),
    "regime": ("label_trajectory", "label_cell", "theory_prediction"),
    "sweep": ("run_phase",),
    "report": ("write_report",),
})

if TYPE_CHECKING:
    from .cell import run_cell
    from .grid import AXES, DEFAULTS, expand_grid, parse_axis
    from .regime import label_cell, label_trajectory, theory_prediction
    from .report import write_report
    from .sweep import run_phase
