"""Progress bars (rich) for the long loops of ``simulate``, ``probe`` and ``basin_estimate``,
and the one test for a terminal that every progress display uses (the sweep engine's
:class:`rankcollapse.sweep.progress.UnitProgress` included).

Shown on stderr when it is a terminal (or when asked with ``progress=True``); quiet
otherwise, so piped output, logs and tests stay clean. The bar is transient: it is
erased when the loop ends.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator


def stderr_is_tty() -> bool:
    """Whether stderr is a terminal (False for a stream without ``isatty``, e.g. a capture)."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


class Steps:
    """Counter handed to a loop: ``advance()`` once per step; ``completed`` counts them."""

    def __init__(self, progress=None, task=None) -> None:
        self.completed = 0
        self._progress, self._task = progress, task

    def advance(self, n: int = 1) -> None:
        self.completed += n
        if self._progress is not None:
            self._progress.advance(self._task, n)


@contextmanager
def steps(total: int, description: str, enabled: bool | None = None) -> Iterator[Steps]:
    """A :class:`Steps` counter with a rich bar of ``total`` steps when ``enabled``
    (None = only when stderr is a terminal)."""
    if enabled is None:
        enabled = stderr_is_tty()
    if not enabled:
        yield Steps()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        yield Steps(bar, bar.add_task(description, total=total))
