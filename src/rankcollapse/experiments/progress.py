"""Progress of a group of units on stderr.

On a terminal: a live rich bar (units done / total, elapsed, ETA, the unit running).
Off a terminal (a log file, a pipe, a batch system): one line when the group starts,
one line per computed unit as it finishes, one summary line, so a log shows progress
from the first minute.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 70


def stderr_is_tty() -> bool:
    """Whether stderr is a terminal."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


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
        self.tty = stderr_is_tty() if tty is None else bool(tty)
        self._stream = stream
        self.done_count = self.cached = 0
        self._t0 = time.perf_counter()
        self._bar = self._task = None

    def __enter__(self) -> "UnitProgress":
        if self.enabled and self.tty and self.total:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._bar = Progress(TextColumn(f"{{task.description:<{WIDTH}}}"), BarColumn(bar_width=20),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
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

    def start(self, n_cached: int, n_compute: int, workers: int, executor: str) -> None:
        """The group begins: ``n_cached`` units come from the cache, ``n_compute`` run."""
        self.cached = n_cached
        self.done_count = n_cached
        if not self.enabled or not self.total:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=n_cached)
        elif n_compute:
            self._line(f"{self.title}: {self.total} units, {n_cached} cached, computing {n_compute} "
                       f"({executor}, {workers} worker{'s' if workers != 1 else ''})")

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
