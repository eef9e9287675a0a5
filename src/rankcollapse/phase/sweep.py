"""Run a phase grid on the sweep engine: one cached unit per cell.

Each cell is a :class:`CellUnit` of kind ``phase_cell``; the executors of
:mod:`rankcollapse.experiments.executors` run the units (serial, worker processes or
Ray) and :class:`rankcollapse.experiments.cache.UnitCache` stores one Parquet file per
cell, so a rerun or an extended grid computes only the new cells.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .._io import code_fingerprint, config_hash
from ..experiments.cache import UnitCache
from ..experiments.config import Unit
from ..experiments.context import RunContext
from ..experiments.executors import make_executor
from ..experiments.progress import UnitProgress

#: Bumped when a change alters the numbers of a cell (invalidates cached cells).
PHASE_VERSION = 1


@dataclass(frozen=True)
class CellUnit(Unit):
    """A phase cell as a sweep unit: ``params = {"cell": {...}, "samples", "seeds", "seed"}``."""

    @property
    def hash(self) -> str:
        return config_hash({"kind": self.kind, "params": self.params, "v": PHASE_VERSION, "code": code_fingerprint()})

    @property
    def label(self) -> str:
        return "phase[" + ", ".join(f"{k}={v}" for k, v in self.params["cell"].items()) + "]"


def cell_unit(unit: Unit, ctx: RunContext) -> pd.DataFrame:
    """The executor entry point of a ``phase_cell`` unit: a one-row frame."""
    from .cell import run_cell

    p = unit.params
    row = run_cell(p["cell"], samples=p["samples"], seeds=p["seeds"], seed=p["seed"])
    return pd.DataFrame([{**p["cell"], **row}])


TABLE = {"phase_cell": cell_unit}


def run_phase(cells: list[dict[str, Any]], *, samples: int = 4, seeds: int = 1, seed: int = 0,
              cache_dir: str | Path, executor: str = "serial", workers: int | None = None,
              address: str | None = None, progress: bool = False) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Rows of every cell (in cell order), computing only cells missing from the cache.

    Returns
    -------
    (table, timing) : one row per cell (axis values, measures, regime, theory columns);
        ``timing`` has ``cells``, ``computed``, ``cached``, ``wall_s``, ``cpu_s`` (summed
        over the workers), ``executor`` and ``workers``.

    Raises
    ------
    ConfigError
        Bad executor options; a cell the dynamics cannot run.
    """
    units = [CellUnit("phase_cell", {"cell": c, "samples": int(samples), "seeds": int(seeds), "seed": int(seed)})
             for c in cells]
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
    table = pd.concat(frames, ignore_index=True)
    timing = {"cells": len(units), "computed": len(todo), "cached": len(units) - len(todo),
              "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(cpu, 2),
              "executor": executor, "workers": getattr(ex, "workers", 1) if ex else 0}
    return table, timing
