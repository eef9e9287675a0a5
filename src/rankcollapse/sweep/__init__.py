"""The sweep engine that experiments and phase grids both run on: units and the registry of
unit kinds, the unit cache, executors, progress, shared run inputs and :func:`run_units`,
the loop cache -> executor -> progress -> cache (docs/sweeps.md).
"""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, imported lazily on first use (attach_imports reads this block).
if TYPE_CHECKING:
    from .cache import UnitCache
    from .context import RunContext, data_spec
    from .engine import run_units
    from .executors import EXECUTOR_NAMES, ExecutionConfig, make_executor, validate_executor
    from .progress import UnitProgress
    from .units import (NUMERICS_VERSION, Shard, Unit, UnitKind, code_fingerprint, numerics_key, register_unit_kind,
                        unit_kind, unit_kinds, unit_labels)

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
