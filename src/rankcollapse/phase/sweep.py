"""Run a phase grid on the sweep engine: cells equal on :data:`.batched.GROUP_KEYS`, in
batches of at most :data:`BATCH_CELLS`, each one cached ``phase_cell`` unit simulated at
once by :func:`.batched.run_group`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd

from .._validate import Spec, check_int
from ..errors import ConfigError
from ..sweep.cache import UnitCache
from ..sweep.context import RunContext
from ..sweep.engine import run_units
from ..sweep.executors import ExecutionConfig, make_executor
from ..sweep.units import Unit, register_unit_kind
from .batched import GROUP_KEYS, run_group
from .grid import check_cells, temperature_columns

#: Most cells simulated in one batch (one unit).
BATCH_CELLS = 64


def cell_unit(unit: Unit, ctx: RunContext) -> pd.DataFrame:
    """The function of a ``phase_cell`` unit: one row per cell of ``params["cells"]``."""
    p = unit.params
    rows = run_group(p["cells"], n_samples=p["n_samples"], seeds=p["seeds"], seed=p["seed"])
    return temperature_columns(pd.DataFrame([{**c, **r} for c, r in zip(p["cells"], rows)]))


def cell_label(unit: Unit) -> str:
    """``phase[64 cells, norm=..., ...]``: the batch size and the values it shares."""
    first = unit.params["cells"][0]
    return f"phase[{len(unit.params['cells'])} cells, " + ", ".join(f"{k}={first[k]}" for k in GROUP_KEYS) + "]"


# version: bumped when a change alters the numbers of a cell (invalidates cached cells)
register_unit_kind("phase_cell", cell_unit, version=7, label=cell_label, group="phase")


def batches(cells: list[dict[str, Any]], size: int) -> list[list[int]]:
    """Indices of ``cells`` grouped by :data:`.batched.GROUP_KEYS`, cut into runs of at most ``size``."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(cells):
        groups.setdefault(tuple(c[k] for k in GROUP_KEYS), []).append(i)
    return [idx[j:j + size] for idx in groups.values() for j in range(0, len(idx), size)]


def cell_units(cells: list[dict[str, Any]], n_samples: int, seeds: int, seed: int) -> tuple[list[Unit], list[list[int]]]:
    """The ``phase_cell`` units of ``cells`` and the indices of each one's cells."""
    parts = batches(cells, BATCH_CELLS)
    units = [Unit("phase_cell", {"cells": [cells[i] for i in part], "n_samples": int(n_samples), "seeds": int(seeds),
                                 "seed": int(seed), **_content_key([cells[i] for i in part])}) for part in parts]
    return units, parts


def _content_key(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The key of what ``cells`` read from files: mask digests, corpus and model keys (``{}``: none)."""
    from ..assets import wikipedia_key
    from ..masks.schedule import mask_digests
    from ..models.loading import model_key

    out: dict[str, Any] = {}
    masks = {str(c["mask"]): mask_digests(c["mask"]) for c in cells}
    if any(masks.values()):
        out["mask_sha256"] = {spec: d for spec, d in masks.items() if d}
    wiki = [Spec.parse(c["input"], "input").params for c in cells if Spec.name_of(c.get("input")) == "wikipedia"]
    if wiki:
        out.update({f"wikipedia_{k}": v for k, v in wikipedia_key().items()})
    models = {p.get("model", "minilm") for p in wiki} | ({"minilm"} if any(c.get("value") == "pretrained" for c in cells)
                                                        else set())
    for name in sorted(models):  # the default model's key as it always was; another's under its name
        out.update({k if name == "minilm" else f"{k}_{name}": v for k, v in model_key(name).items()})
    return out


def run_phase(cells: list[dict[str, Any]], *, n_samples: int = 4, seeds: int = 1, seed: int = 0,
              cache_dir: str | Path, execution: ExecutionConfig | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Rows of every cell (in cell order), computing only batches missing from the cache.

    ``execution``: as for :func:`rankcollapse.experiments.run_experiment` (default serial);
    cells run in float64 on the CPU, so a ``device`` or a ``shard`` is refused. Returns
    ``(table, timing)``: one row per cell, and ``cells``, ``units``, ``computed``, ``cached``,
    ``wall_s``, ``cpu_s``, ``executor``, ``workers``. Raises :class:`ConfigError` for a bad
    argument or cell (:func:`.grid.check_cells`), :class:`MemoryLimitError` for a cell too large.

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
    ...     table, timing = run_phase(cells, n_samples=2, cache_dir=cache)
    ...     _, again = run_phase(cells, n_samples=2, cache_dir=cache)  # every unit from the cache
    >>> table[["norm", "regime"]].to_dict("records")
    [{'norm': 'none', 'regime': 'rank_collapse'}, {'norm': 'layernorm', 'regime': 'rank_collapse'}]
    >>> timing["computed"], again["computed"]
    (2, 0)
    """
    if execution is None:
        execution = ExecutionConfig(progress=False)
    if not isinstance(execution, ExecutionConfig):
        raise ConfigError(f"must be an ExecutionConfig, got {type(execution).__name__}", argument="execution")
    if execution.device != "cpu":
        raise ConfigError(f"must be 'cpu' (a phase run computes its cells in float64 on the CPU), got "
                          f"{execution.device!r}", argument="device")
    if execution.shard is not None:
        raise ConfigError(f"does not apply to a phase run (it computes every batch of its grid), got "
                          f"{execution.shard}", argument="shard")
    n_samples, seeds = check_int(n_samples, "n_samples", low=1), check_int(seeds, "seeds", low=1)
    seed = check_int(seed, "seed", low=0)
    check_cells(cells, n_samples, seeds=seeds)
    units, parts = cell_units(cells, n_samples, seeds, seed)
    cache = UnitCache(Path(cache_dir))
    cache.remove_orphans()
    t0 = time.perf_counter()
    made: list[Any] = []

    def start() -> Any:  # only when a batch must be computed: a cached grid starts no worker
        made.append(make_executor(execution.executor, workers=execution.workers, address=execution.address))
        return made[0]

    frames, timings = run_units(units, RunContext({}), cache, executor=start, progress=execution.progress,
                                title="phase")
    computed = [t for t in timings if not t["cached"]]
    table = pd.concat(frames, ignore_index=True)
    table.index = [i for part in parts for i in part]
    table = temperature_columns(table.sort_index().reset_index(drop=True))
    timing = {"cells": len(cells), "units": len(units), "computed": len(computed), "cached": len(units) - len(computed),
              "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(sum(t["cpu_seconds"] for t in computed), 2),
              "executor": execution.executor, "workers": getattr(made[0], "workers", 1) if made else 0}
    return table, timing

