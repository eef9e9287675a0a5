"""Transient progress bars (rich) on stderr for long loops, shown only on a terminal unless asked."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator


def stderr_is_tty() -> bool:
    """Whether stderr is a terminal (False for a stream without ``isatty``)."""
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
    """A :class:`Steps` counter with a bar of ``total`` steps when ``enabled`` (None: on a terminal)."""
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
