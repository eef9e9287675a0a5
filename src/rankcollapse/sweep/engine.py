"""The sweep loop: read what the cache has, compute the rest on an executor, report progress,
write each computed unit to the cache as it arrives.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from .cache import UnitCache
from .executors import SerialExecutor
from .progress import UnitProgress
from .units import Unit, unit_functions


def run_units(units: Iterable[Unit], ctx: Any, cache: Path | str | UnitCache, *, executor: Any = None,
              progress: bool | UnitProgress = True, title: str = "units", labels: Mapping[str, str] | None = None,
              order: Callable[[Unit], Any] | None = None) -> tuple[list[pd.DataFrame], list[dict[str, Any]]]:
    """The frame of every unit, computing only those missing from ``cache`` (each written as
    soon as it arrives: an interrupted sweep loses only the units in flight).

    Parameters
    ----------
    ctx : the :class:`~.context.RunContext` of this process (workers build their own).
    executor : an executor (:mod:`.executors`; default serial), or a function that makes one
        only when a unit must be computed (closed here).
    progress : report on stderr, or a :class:`UnitProgress` that already announced these units.
    labels : ``{hash: label}`` (default :attr:`~.units.Unit.label`); order : sort key of the run order.

    Returns ``(frames, timings)``: the frames in the order of ``units``, one :func:`unit_timing`
    record per unit in compute order. Raises ``ConfigError``: a unit of an unregistered kind
    (and whatever a unit's function raises).
    """
    units = list(units)
    cache = cache if isinstance(cache, UnitCache) else UnitCache(Path(cache))
    table = unit_functions(units)
    labels = labels or {u.hash: u.label for u in units}
    frames: dict[int, pd.DataFrame] = {}
    timings: dict[int, dict[str, Any]] = {}
    rank = sorted(range(len(units)), key=(lambda k: order(units[k])) if order else None)
    todo = []
    for i in rank:
        t0 = time.perf_counter()
        df = cache.get(units[i])
        if df is None:
            todo.append(i)
            continue
        frames[i] = df
        timings[i] = unit_timing(units[i], labels[units[i].hash], True, time.perf_counter() - t0, 0.0, "cache",
                                 cache.cost(units[i]))
    made = bool(todo) and executor is not None and not hasattr(executor, "map")
    ex = (executor() if made else executor) or SerialExecutor()
    try:
        shared = isinstance(progress, UnitProgress)
        with nullcontext(progress) if shared else UnitProgress(title, len(units), enabled=bool(progress)) as bar:
            if not shared:
                bar.expect(units[i] for i in todo)
                bar.start(len(frames), len(todo), getattr(ex, "workers", 1), getattr(ex, "name", "-"))
            if todo:
                bar.running(labels[units[todo[0]].hash])
                _compute(units, todo, ctx, ex, table, cache, labels, bar, frames, timings)
    finally:
        if made:
            ex.close()
    return [frames[i] for i in range(len(units))], [timings[i] for i in rank]


def _compute(units: list[Unit], todo: list[int], ctx: Any, ex: Any, table: Mapping[str, Any], cache: UnitCache,
             labels: Mapping[str, str], bar: UnitProgress, frames: dict, timings: dict) -> None:
    for done in ex.map([units[i] for i in todo], ctx, table):
        i = todo[done.index]
        cost = {"seconds": round(done.wall, 3), "cpu_seconds": round(done.cpu, 3), "worker": done.worker,
                "computed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        cache.put(units[i], done.frame, cost)
        frames[i] = done.frame
        timings[i] = unit_timing(units[i], labels[units[i].hash], False, done.wall, done.cpu, done.worker, cost)
        bar.finished(labels[units[i].hash], done.wall, done.worker, unit=units[i])
        left = [k for k in todo if k not in frames]
        if left:
            bar.running(labels[units[left[0]].hash])


def unit_timing(u: Unit, label: str, cached: bool, wall: float, cpu: float, worker: str,
                cost: dict[str, Any] | None) -> dict[str, Any]:
    """One unit's record: ``seconds``/``cpu_seconds`` this run spent on it (reading or computing),
    ``compute_seconds``/``compute_cpu_seconds`` what computing its numbers cost (None: unknown)."""
    cost = cost or {}
    return {"unit": label, "hash": u.hash, "kind": u.kind, "cached": cached, "seconds": round(wall, 3),
            "cpu_seconds": round(cpu, 3), "worker": worker, "compute_seconds": cost.get("seconds"),
            "compute_cpu_seconds": cost.get("cpu_seconds"), "computed_at": cost.get("computed_at")}
