"""Phase diagram of self-attention dynamics: which weights, masks and norms collapse rank
(docs/phase.md)."""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, imported lazily on first use (attach_imports reads this block).
if TYPE_CHECKING:
    from .cell import run_cell
    from .grid import AXES, DEFAULTS, expand_grid, parse_axis
    from .regime import label_cell, label_trajectory, theory_prediction
    from .report import write_report
    from .sweep import run_phase

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
