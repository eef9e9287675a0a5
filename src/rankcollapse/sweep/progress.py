"""Progress of a group of units on stderr: a live rich bar on a terminal, else one line at the
start, one per computed unit and a summary (docs/sweeps.md, "Progress and timings").
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from typing import Any, Iterable, TextIO

from .. import _progress

WIDTH = 70


def short(text: str, width: int = WIDTH) -> str:
    """``text`` cut to ``width`` characters with an ellipsis."""
    return text if len(text) <= width else text[: width - 1] + "…"


def cost_class(unit: Any) -> str:
    """The units whose wall times estimate each other's: the kind, and its model if any (``probe[smollm2]``)."""
    model = getattr(unit, "params", {}).get("model")
    return unit.kind if model is None else f"{unit.kind}[{model}]"


def format_eta(seconds: float, untimed: int, left: int) -> str:
    """The ETA of ``left`` units (``seconds``, ``untimed`` from :meth:`UnitProgress.eta`): ``ETA 12 s``,
    ``ETA ≥ 12 s (2 units not yet timed)``, ``ETA unknown (...)``, ``ETA < 1 s``; ``ETA 0 s`` only at the end."""
    if left <= 0:
        return "ETA 0 s"
    text = "< 1 s" if seconds < 0.5 else f"{math.floor(seconds + 0.5):.0f} s"
    if untimed:
        units = f"{untimed} unit{'s' if untimed != 1 else ''} not yet timed"
        return f"ETA unknown ({units})" if seconds < 0.5 else f"ETA ≥ {text} ({units})"
    return f"ETA {text}"


class UnitProgress:
    """Progress of ``total`` units titled ``title``; a context manager. ``tty``: live bar
    (default: stderr is a terminal); ``stream``: where lines go (default: ``sys.stderr`` at each write)."""

    def __init__(self, title: str, total: int, *, enabled: bool = True, tty: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.title, self.total, self.enabled = title, int(total), bool(enabled)
        self.tty = _progress.stderr_is_tty() if tty is None else bool(tty)
        self._stream = stream
        self.done_count = self.cached = 0
        self._t0 = time.perf_counter()
        self._bar = self._task = None
        self._left: Counter[str] = Counter()  # cost class -> units still to compute
        self._walls: dict[str, list[float]] = {}  # cost class -> wall times of finished units
        self.workers = 1  # units computed at once: the ETA divides by it

    def expect(self, units: Iterable[Any]) -> None:
        """``units`` are to be computed (their cost classes feed the ETA)."""
        self._left.update(cost_class(u) for u in units)

    def eta(self) -> tuple[float, int]:
        """``(seconds, untimed)``: the estimated wall time of the units left (per cost class, its
        units times its mean wall, over the workers) and how many are of a class not yet timed."""
        left = self.total - self.done_count
        walls = [w for ws in self._walls.values() for w in ws]
        if not self._left:  # no class information: every unit alike
            return (sum(walls) / len(walls) * left / self.workers if walls else 0.0), (0 if walls else left)
        seconds, untimed = 0.0, 0
        for cls, n in self._left.items():
            if self._walls.get(cls):
                seconds += n * sum(self._walls[cls]) / len(self._walls[cls])
            else:
                untimed += n
        return seconds / self.workers, untimed

    def __enter__(self) -> "UnitProgress":
        if self.enabled and self.tty and self.total:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            from rich.table import Column

            # the description gives way on a narrow terminal: counts and ETA stay
            description = Column(min_width=12, max_width=WIDTH, overflow="ellipsis", no_wrap=True)
            self._bar = Progress(TextColumn("{task.description}", markup=False, table_column=description),
                                 BarColumn(bar_width=20),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[eta]}", markup=False),
                                 console=Console(stderr=True), transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task(short(self.title), total=self.total, eta="")
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
        elif self.enabled and self.total and exc[0] is None:
            self._line(f"{self.title}: {self.total} units ({self.cached} cached) in "
                       f"{time.perf_counter() - self._t0:.1f} s")

    def _line(self, text: str) -> None:
        print(text, file=self._stream or sys.stderr, flush=True)

    def start(self, n_cached: int, n_compute: int, workers: int, executor: str,
              groups: list[tuple[str, int]] | None = None) -> None:
        """The run begins: ``n_cached`` units from the cache, ``n_compute`` to run; ``groups``:
        ``[(name, units)]`` of the plan, named when there are several."""
        self.cached = self.done_count = n_cached
        self.workers = max(int(workers), 1)
        if not self.enabled or not self.total:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=n_cached)
        elif n_compute:
            plan = f" ({', '.join(f'{name} {n}' for name, n in groups)})" if groups and len(groups) > 1 else ""
            self._line(f"{self.title}: {self.total} units{plan}, {n_cached} cached, computing {n_compute} "
                       f"({executor}, {workers} worker{'s' if workers != 1 else ''})")

    def drop(self, n: int, reason: str, cached: int = 0, units: Iterable[Any] = ()) -> None:
        """Take ``n`` planned units out of the total (``reason``, in the log): ``cached`` of them
        counted as done, ``units`` those of them expected to be computed."""
        self._left.subtract(cost_class(u) for u in units)
        self._left = +self._left
        if n <= 0:
            return
        self.total -= n
        self.cached -= cached
        self.done_count -= cached
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, total=self.total, completed=self.done_count)
        else:
            self._line(f"{self.title}: {n} planned units not run ({reason}); {self.total} units in all")

    def running(self, label: str) -> None:
        """Show ``label`` as the unit running (the bar's description)."""
        if self._bar is not None:
            self._bar.update(self._task, description=short(f"{self.title}: {label}"))

    def finished(self, label: str, wall: float, worker: str = "", unit: Any = None) -> None:
        """A computed unit is done (``wall`` seconds); ``unit`` gives its cost class."""
        self.done_count += 1
        cls = cost_class(unit) if unit is not None else None
        if cls is not None and self._left[cls] > 0:
            self._left[cls] -= 1
            self._left = +self._left
        self._walls.setdefault(cls if cls is not None else "", []).append(float(wall))
        if not self.enabled:
            return
        eta = format_eta(*self.eta(), self.total - self.done_count)
        if self._bar is not None:
            self._bar.update(self._task, advance=1, eta=eta)
            return
        elapsed = time.perf_counter() - self._t0
        self._line(f"{self.title} [{self.done_count}/{self.total}] {label} {wall:.1f} s"
                   f" (elapsed {elapsed:.0f} s, {eta})")
