"""Run a phase grid on the sweep engine: one cached unit per batch of cells.

Cells equal on :data:`.batched.GROUP_KEYS` are cut into batches of at most
:data:`BATCH_CELLS` and each batch is a :class:`CellUnit` of kind ``phase_cell``,
simulated at once by :func:`.batched.run_group`. The executors of
:mod:`rankcollapse.experiments.executors` run the units (serial, worker processes or
Ray) and :class:`rankcollapse.experiments.cache.UnitCache` stores one Parquet file per
batch, so a rerun computes nothing and an extended grid only the new batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .._deprecation import renamed_arguments
from .._io import code_fingerprint, config_hash
from .batched import GROUP_KEYS, run_group
from .grid import check_cells
from ..experiments.cache import UnitCache
from ..experiments.config import Unit
from ..experiments.context import RunContext
from ..experiments.executors import make_executor
from ..experiments.progress import UnitProgress

#: Most cells simulated in one batch (one unit).
BATCH_CELLS = 64
#: Bumped when a change alters the numbers of a cell (invalidates cached cells).
PHASE_VERSION = 2


@dataclass(frozen=True)
class CellUnit(Unit):
    """A batch of phase cells as a sweep unit: ``params = {"cells": [...], "samples", "seeds", "seed"}``."""

    @property
    def hash(self) -> str:
        return config_hash({"kind": self.kind, "params": self.params, "v": PHASE_VERSION, "code": code_fingerprint()})

    @property
    def label(self) -> str:
        first = self.params["cells"][0]
        return f"phase[{len(self.params['cells'])} cells, " + ", ".join(f"{k}={first[k]}" for k in GROUP_KEYS) + "]"


def cell_unit(unit: Unit, ctx: RunContext) -> pd.DataFrame:
    """The executor entry point of a ``phase_cell`` unit: one row per cell."""
    p = unit.params
    rows = run_group(p["cells"], samples=p["samples"], seeds=p["seeds"], seed=p["seed"])
    return pd.DataFrame([{**c, **r} for c, r in zip(p["cells"], rows)])


def batches(cells: list[dict[str, Any]], size: int) -> list[list[int]]:
    """Indices of ``cells`` grouped by :data:`.batched.GROUP_KEYS` (first-seen order),
    each group cut into runs of at most ``size``."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(cells):
        groups.setdefault(tuple(c[k] for k in GROUP_KEYS), []).append(i)
    return [idx[j:j + size] for idx in groups.values() for j in range(0, len(idx), size)]


TABLE = {"phase_cell": cell_unit}


@renamed_arguments(samples="n_samples")
def run_phase(cells: list[dict[str, Any]], *, n_samples: int = 4, seeds: int = 1, seed: int = 0,
              cache_dir: str | Path, executor: str = "serial", workers: int | None = None,
              address: str | None = None, progress: bool = False) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Rows of every cell (in cell order), computing only batches missing from the cache.

    Returns
    -------
    (table, timing) : one row per cell (axis values, measures, regime, theory columns);
        ``timing`` has ``cells``, ``units``, ``computed``, ``cached`` (units), ``wall_s``, ``cpu_s`` (summed
        over the workers), ``executor`` and ``workers``.

    Raises
    ------
    ConfigError
        Bad executor options; no cells; a cell the dynamics cannot run.
    MemoryLimitError
        A cell too large for the memory limit (:func:`.grid.check_cells`).

    See Also
    --------
    rankcollapse.phase.expand_grid : the cells of a grid of axes.
    rankcollapse.phase.run_cell : one cell, without the cache.
    rankcollapse.experiments.run_experiment : the paper's experiments on the same engine.

    Examples
    --------
    >>> import tempfile
    >>> from rankcollapse.phase import expand_grid
    >>> cells = expand_grid({"norm": ["none", "layernorm"]}, {"n_tokens": 8, "d_model": 4, "depth": 8})
    >>> with tempfile.TemporaryDirectory() as cache:
    ...     table, timing = run_phase(cells, samples=2, cache_dir=cache)
    ...     _, again = run_phase(cells, samples=2, cache_dir=cache)  # every unit from the cache
    >>> table[["norm", "regime"]].to_dict("records")
    [{'norm': 'none', 'regime': 'rank_collapse'}, {'norm': 'layernorm', 'regime': 'rank_collapse'}]
    >>> timing["computed"], again["computed"]
    (2, 0)
    """
    check_cells(cells, n_samples)
    parts = batches(cells, BATCH_CELLS)
    units = [CellUnit("phase_cell", {"cells": [cells[i] for i in part], "samples": int(n_samples), "seeds": int(seeds),
                                     "seed": int(seed)}) for part in parts]
    cache = UnitCache(Path(cache_dir))
    cache.remove_orphans()
    t0 = time.perf_counter()
    frames: list[pd.DataFrame | None] = [cache.get(u) for u in units]
    todo = [i for i, f in enumerate(frames) if f is None]
    cpu = 0.0
    ex = make_executor(executor, workers=workers, address=address) if todo else None
    try:
        with UnitProgress("phase", len(units), enabled=progress) as bar:
            bar.start(len(units) - len(todo), len(todo), getattr(ex, "workers", 1), getattr(ex, "name", "-"))
            if todo:
                for done in ex.map([units[i] for i in todo], RunContext({}), TABLE):
                    i = todo[done.index]
                    cache.put(units[i], done.frame)
                    frames[i] = done.frame
                    cpu += done.cpu
                    bar.finished(units[i].label, done.wall, done.worker)
    finally:
        if ex is not None:
            ex.close()
    order = [i for part in parts for i in part]
    table = pd.concat(frames, ignore_index=True)
    table.index = order
    table = table.sort_index().reset_index(drop=True)
    timing = {"cells": len(cells), "units": len(units), "computed": len(todo), "cached": len(units) - len(todo),
              "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(cpu, 2),
              "executor": executor, "workers": getattr(ex, "workers", 1) if ex else 0}
    return table, timing
