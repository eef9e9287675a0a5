"""Ownership of an output folder: one run at a time, and only its own outputs.

A run holds an exclusive ``fcntl.flock`` on ``<out>/.rankcollapse.lock`` for its whole
life; the file names the owner (pid, host, start time) for whoever finds it taken. The
kernel drops the lock when the owner dies (``kill -9`` included), so a lock left by a
dead run is taken over by the next one without any staleness guess. (``flock`` is
per machine: two hosts writing one ``--out`` on a network file system are not guarded;
give each host its own ``--out`` and share only the cache.)
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from .._io import open_private, read_regular
from ..errors import OutputBusyError

LOCK_NAME = ".rankcollapse.lock"
#: Top-level files a run writes; anything else in the folder (but ``plots/`` and orphan
#: temporary files) is left alone, so an ``--out`` holding a user's own files is safe.
OUTPUT_NAMES = ("table.parquet", "table.csv", "claims.json", "config.json", "report.html", "report.md")


class OutputFolder:
    """The lock on output folder ``out`` (a context manager).

    Parameters
    ----------
    wait : when another live run holds the folder, wait for it instead of failing.
    poll_s : how often to retry while waiting.

    Raises
    ------
    OutputBusyError
        On entry, when another live run holds ``out`` and ``wait`` is false; the message
        names its pid, host and start time.
    """

    def __init__(self, out: str | os.PathLike, *, wait: bool = False, poll_s: float = 1.0) -> None:
        self.out, self.wait, self.poll_s = Path(out), bool(wait), float(poll_s)
        self._fd: int | None = None

    @property
    def lock_path(self) -> Path:
        return self.out / LOCK_NAME

    def __enter__(self) -> "OutputFolder":
        self.out.mkdir(parents=True, exist_ok=True)
        fd = open_private(self.lock_path, "lock file")
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not self.wait:
                    os.close(fd)
                    raise OutputBusyError(f"{self.out} is in use by {describe(owner(self.out))}; "
                                          "wait for it (--wait) or choose another --out") from None
                time.sleep(self.poll_s)
        self._fd = fd
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        remove_orphan_tmp(self.out)  # no other writer can be alive now
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            # the file stays (unlinking it would let a waiter lock a file a third run
            # no longer sees); closing the descriptor releases the lock
            os.close(self._fd)
            self._fd = None


def owner(out: str | os.PathLike) -> dict[str, Any]:
    """The owner recorded in ``out``'s lock file (``{}`` if none or unreadable)."""
    try:
        info = json.loads(read_regular(Path(out) / LOCK_NAME, "lock file") or b"{}")
    except (OSError, ValueError):  # UnsafePathError is a ValueError: an unsafe lock names no owner
        return {}
    return info if isinstance(info, dict) else {}


def describe(info: dict[str, Any]) -> str:
    """``run pid 123 on host h since 2026-...Z`` (or ``another run`` if unknown)."""
    if not info:
        return "another run"
    return f"run pid {info.get('pid')} on host {info.get('host')} since {info.get('started')}"


def remove_orphan_tmp(out: Path) -> list[Path]:
    """Delete the temporary files of killed writers (``.<name>.*.tmp``) in ``out`` and
    ``out/plots``; call only while holding the lock. Returns the removed paths."""
    removed = []
    for folder in (out, out / "plots"):
        for tmp in folder.glob(".*.tmp") if folder.is_dir() else ():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def snapshot(out: Path) -> dict[Path, tuple[int, int, int]]:
    """``{path: (inode, mtime_ns, size)}`` of the outputs a run may replace: the known
    output files and every file under ``plots/``. Taken before a run writes."""
    paths = [out / n for n in OUTPUT_NAMES]
    if (out / "plots").is_dir():
        paths += [p for p in (out / "plots").rglob("*") if p.is_file()]
    out_stats = {}
    for p in paths:
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        out_stats[p] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out_stats


def remove_unwritten(out: Path, before: dict[Path, tuple[int, int, int]]) -> list[Path]:
    """Delete the outputs of :func:`snapshot` ``before`` that this run did not rewrite
    (same inode, time and size: a plot of an earlier, different experiment), and orphan
    temporary files. Returns the removed paths."""
    removed = remove_orphan_tmp(out)
    for p, stat in snapshot(out).items():
        if before.get(p) == stat:
            p.unlink()
            removed.append(p)
    for d in sorted((out / "plots").rglob("*"), reverse=True) if (out / "plots").is_dir() else ():
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    return removed
