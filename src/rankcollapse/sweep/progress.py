"""Progress of a group of units on stderr.

On a terminal: a live rich bar (units done / total, elapsed, ETA, the unit running).
Off a terminal (a log file, a pipe, a batch system): one line when the run starts
(the whole plan: every group and its units, how many are cached), one line per computed
unit as it finishes, one summary line, so a log shows progress from the first minute.

One bar covers a whole run: the total counts every unit the run plans (default
settings and nearby settings alike), so the ETA is the time to the end of the run, not
of its first group. A planned unit that will not run after all (the nearby settings of
a claim the run could not decide) is taken out of the total with a line that says so
(:meth:`UnitProgress.drop`).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .. import _progress

WIDTH = 70


def short(text: str, width: int = WIDTH) -> str:
    """``text`` cut to ``width`` characters with an ellipsis (rich's column is fixed)."""
    return text if len(text) <= width else text[: width - 1] + "…"


class UnitProgress:
    """Progress of ``total`` units titled ``title``; a context manager.

    Parameters
    ----------
    enabled : report at all.
    tty : live bar (default: whether stderr is a terminal).
    stream : where lines go off a terminal (default: ``sys.stderr`` at each write, so
        pytest's capture sees them).
    """

    def __init__(self, title: str, total: int, *, enabled: bool = True, tty: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.title, self.total, self.enabled = title, int(total), bool(enabled)
        self.tty = _progress.stderr_is_tty() if tty is None else bool(tty)
        self._stream = stream
        self.done_count = self.cached = 0
        self._t0 = time.perf_counter()
        self._bar = self._task = None

    def __enter__(self) -> "UnitProgress":
        if self.enabled and self.tty and self.total:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._bar = Progress(TextColumn(f"{{task.description:<{WIDTH}}}", markup=False), BarColumn(bar_width=20),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA", markup=False), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task(short(self.title), total=self.total)
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
        """The run begins: ``n_cached`` units come from the cache, ``n_compute`` run.
        ``groups``: ``[(name, units)]`` of the plan, named in the first line when there
        are several (e.g. default settings and nearby settings)."""
        self.cached = n_cached
        self.done_count = n_cached
        if not self.enabled or not self.total:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=n_cached)
        elif n_compute:
            plan = f" ({', '.join(f'{name} {n}' for name, n in groups)})" if groups and len(groups) > 1 else ""
            self._line(f"{self.title}: {self.total} units{plan}, {n_cached} cached, computing {n_compute} "
                       f"({executor}, {workers} worker{'s' if workers != 1 else ''})")

    def drop(self, n: int, reason: str, cached: int = 0) -> None:
        """Take ``n`` planned units that will not be used out of the total (``reason``
        says why, in the log); ``cached`` of them were counted as done from the cache."""
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

    def finished(self, label: str, wall: float, worker: str = "") -> None:
        """A computed unit is done (``wall`` seconds)."""
        self.done_count += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.advance(self._task)
            return
        elapsed = time.perf_counter() - self._t0
        left = self.total - self.done_count
        rate = elapsed / max(self.done_count - self.cached, 1)
        self._line(f"{self.title} [{self.done_count}/{self.total}] {label} {wall:.1f} s"
                   f" (elapsed {elapsed:.0f} s, ETA {rate * left:.0f} s)")
