"""Phase diagram of self-attention dynamics: which weights, masks and norms collapse rank.

``grid`` parses axes into cells, ``cell`` runs one cell through
:func:`rankcollapse.dynamics.simulate`, ``regime`` labels it (rule in docs/phase.md),
``predict`` gives the theory's prediction and checks Theorem 1's envelope per layer,
``sweep`` runs many cells on the sweep engine (:mod:`rankcollapse.sweep`: executors,
cache, progress), ``report`` writes the table, heatmaps and report.html, ``findings``
summarises a table and ``normalisation`` decides the speed-law and ordering claims.

Layering (pyproject.toml ``[tool.importlinter]``, tests/test_layering.py): ``phase`` may import
``sweep``, ``theory``, ``dynamics``, ``models``, ``metrics``, ``masks`` and everything below
them; not ``experiments`` (its sweep runs on the shared sweep engine) and not ``cli``.
"""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, written once: imported lazily on first use (attach_imports reads this
# block), eagerly by readers and static tools.
if TYPE_CHECKING:
    from .cell import run_cell
    from .grid import AXES, DEFAULTS, expand_grid, parse_axis
    from .regime import label_cell, label_trajectory, theory_prediction
    from .report import write_report
    from .sweep import run_phase

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
