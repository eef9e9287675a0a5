"""The sweep engine: units of work, the registry of unit kinds, the unit cache, the
executors, progress, and :func:`run_units`, the loop cache -> executor -> progress ->
cache that experiments (``rankcollapse reproduce``) and phase grids (``rankcollapse
phase``) both run on.

``units`` (:class:`Unit`, :func:`register_unit_kind`: kind -> function, version,
label; the key's numerics fingerprint), ``cache`` (one Parquet file per unit),
``executors`` (serial, worker processes, Ray), ``progress`` (a bar or log lines),
``context`` (inputs shared by the units of one run: texts, windows, models,
embeddings), ``engine`` (:func:`run_units`). Adding a unit kind is one registry entry
and one function (docs/sweeps.md, "Adding a unit kind").
"""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, written once: imported lazily on first use (attach_imports reads this
# block; static tools and readers see ordinary imports).
if TYPE_CHECKING:
    from .cache import UnitCache
    from .context import RunContext, data_spec
    from .engine import run_units
    from .executors import EXECUTOR_NAMES, ExecutionConfig, make_executor, validate_executor
    from .progress import UnitProgress
    from .units import (NUMERICS_VERSION, Shard, Unit, UnitKind, code_fingerprint, numerics_key, register_unit_kind,
                        unit_kind, unit_kinds, unit_labels)

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
