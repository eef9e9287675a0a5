"""Ownership of an output folder: one run at a time, and only its own outputs.

A run holds an exclusive ``fcntl.flock`` on ``<out>/.rankcollapse.lock`` for its whole
life; the file names the owner (pid, host, start time) for whoever finds it taken. The
kernel drops the lock when the owner dies (``kill -9`` included), so a lock left by a
dead run is taken over by the next one without any staleness guess. (``flock`` is
per machine: two hosts writing one ``--out`` on a network file system are not guarded;
give each host its own ``--out`` and share only the cache.)

Only its own outputs: a run builds every output in a staging folder inside ``out`` and
publishes it when complete (:func:`publish`): each file is renamed into place, the
files the previous run listed in its manifest (``.rankcollapse-manifest.json``) and this
run did not write are removed, then the manifest and the ``COMPLETE`` marker are
written. A user's own files (``plots/my_figure.png``, ``.draft.tmp``) are never listed,
so never removed; a failure while building (a full disk) leaves the previous run whole.
A non-empty folder that no run of this toolkit wrote is refused unless the caller
allows it (``--allow-nonempty``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from .._io import TMP_SUFFIX, open_private, read_regular, write_json_atomic, write_text_atomic
from ..errors import ConfigError, OutputBusyError

LOCK_NAME = ".rankcollapse.lock"
#: Top-level files a run writes; anything else in the folder (but ``plots/`` and orphan
#: temporary files) is left alone, so an ``--out`` holding a user's own files is safe.
OUTPUT_NAMES = ("table.parquet", "table.csv", "claims.json", "config.json", "report.html", "report.md")
MANIFEST = ".rankcollapse-manifest.json"
STAGING = ".rankcollapse-staging"
MARKER = "COMPLETE"
#: Names a run of this toolkit leaves in a folder: their presence marks it as ours.
OWN_NAMES = (LOCK_NAME, MANIFEST, MARKER)


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

    def __init__(self, out: str | os.PathLike, *, wait: bool = False, poll_s: float = 1.0,
                 allow_nonempty: bool = False) -> None:
        self.out, self.wait, self.poll_s = Path(out), bool(wait), float(poll_s)
        self.allow_nonempty = bool(allow_nonempty)
        self._fd: int | None = None
        self._fresh = False

    @property
    def lock_path(self) -> Path:
        return self.out / LOCK_NAME

    def __enter__(self) -> "OutputFolder":
        if not self.allow_nonempty:
            check_own_or_empty(self.out)
        # a folder this run makes (absent or empty before) is removed again by a failure
        self._fresh = not self.out.exists() or (self.out.is_dir() and not any(self.out.iterdir()))
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
                                          "wait for that run to finish or choose another output folder") from None
                time.sleep(self.poll_s)
        self._fd = fd
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        remove_orphan_tmp(self.out)  # no other writer can be alive now
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._fd is None:
            return
        if exc_type is not None and self._fresh:
            # a failed run in a folder it made leaves nothing behind (docs/errors.md): the
            # lock goes while still held, then every folder the run left empty
            self.lock_path.unlink(missing_ok=True)
            _remove_empty(self.out)
        # otherwise the file stays (unlinking it would let a waiter lock a file a third
        # run no longer sees); closing the descriptor releases the lock
        os.close(self._fd)
        self._fd = None


def _remove_empty(folder: Path) -> None:
    """Remove ``folder`` and the folders under it that hold no file (bottom up)."""
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink()), reverse=True):
        try:
            sub.rmdir()
        except OSError:  # holds a file: kept
            pass
    try:
        folder.rmdir()
    except OSError:
        pass


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


def check_own_or_empty(out: Path, *, flags: bool = False) -> None:
    """Refuse ``out`` when it is a non-empty folder that no run of this toolkit wrote
    (none of :data:`OWN_NAMES` in it): a run there would mix its outputs with files it
    does not know.

    Raises
    ------
    ConfigError
        Naming the folder and the argument that allows it (``allow_nonempty``; with
        ``flags``, the command line's ``--out`` and ``--allow-nonempty``).
    """
    if not out.is_dir():
        return
    names = {p.name for p in out.iterdir()}
    if names and not names & set(OWN_NAMES):
        o, allow = ("--out", "--allow-nonempty") if flags else ("out", "allow_nonempty=True")
        raise ConfigError(f"{o} {str(out)!r} is a non-empty folder that no run wrote ({len(names)} entries); "
                          f"choose a new or empty folder, or pass {allow} to write beside its files")


def remove_orphan_tmp(out: Path) -> list[Path]:
    """Delete what killed writers of this toolkit left in ``out`` and ``out/plots``: their
    temporary files (``.<name>.*`` + :data:`~rankcollapse._io.TMP_SUFFIX`) and a staging
    folder. Call only while holding the lock. Returns the removed paths."""
    removed = []
    for folder in (out, out / "plots"):
        for tmp in folder.glob(f".*{TMP_SUFFIX}") if folder.is_dir() else ():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    staging = out / STAGING
    if staging.is_dir() and not staging.is_symlink():
        shutil.rmtree(staging)
        removed.append(staging)
    return removed


def staging_folder(out: Path) -> Path:
    """A fresh, empty staging folder inside ``out`` (same file system, so publishing is
    renames only). Call only while holding the lock."""
    staging = out / STAGING
    if staging.is_symlink():
        staging.unlink()
    elif staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    return staging


def manifest(out: Path) -> set[str]:
    """The relative paths the last published run wrote (empty for none, or for a run of an
    earlier version, whose top-level :data:`OUTPUT_NAMES` are then taken as its own)."""
    try:
        listed = json.loads(read_regular(out / MANIFEST, "manifest"))
    except FileNotFoundError:
        return set(OUTPUT_NAMES) if (out / MARKER).is_file() else set()
    except ValueError:  # a link, or not JSON: nothing in it is trusted
        return set()
    return {p for p in listed if isinstance(p, str)} if isinstance(listed, list) else set()


def publish(out: Path, staging: Path, marker_text: str) -> list[Path]:
    """Move every file built in ``staging`` into ``out``, remove the files the previous
    run's manifest lists that this run did not write (never anything else), then write
    the manifest and, last, the ``COMPLETE`` marker. Returns the removed paths.

    The marker is removed first, so a folder marked ``COMPLETE`` always holds exactly one
    run's outputs. Call only while holding the lock."""
    new = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    old = manifest(out)
    (out / MARKER).unlink(missing_ok=True)
    for rel in new:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, out / rel)
    removed = []
    for rel in sorted(old - set(new)):
        target = out / rel
        if ".." in Path(rel).parts or not (target.is_file() or target.is_symlink()):
            continue
        target.unlink()
        removed.append(target)
        parent = target.parent
        while parent != out and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    shutil.rmtree(staging, ignore_errors=True)
    write_json_atomic(out / MANIFEST, new)
    write_text_atomic(out / MARKER, marker_text)
    return removed
