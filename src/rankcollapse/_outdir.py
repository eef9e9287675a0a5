"""Output folders: every command writes into ``--out`` through this module, only its own files.

What is in an output folder is untrusted. A run writes and deletes only names of
:data:`PRODUCED`, reached through ``O_NOFOLLOW`` directory descriptors (a link or non-regular
file on the way is refused); trusts its manifest only when it lists such names; never
replaces a file it did not write. A run holds an ``fcntl.flock`` on ``.rankcollapse.lock``
(per machine; the kernel drops it when the owner dies), builds its outputs in a staging
folder and publishes them whole (:func:`publish`). A non-empty folder no run wrote is
refused unless allowed (``--allow-nonempty``). See docs/errors.md.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import time
from contextlib import contextmanager
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Iterator

from ._io import TMP_SUFFIX, check_writable, open_private, read_regular, write_json_atomic, write_text_atomic
from .errors import ConfigError, OutputBusyError, UnsafePathError, excerpt

LOCK_NAME = ".rankcollapse.lock"
MANIFEST = ".rankcollapse-manifest.json"
STAGING = ".rankcollapse-staging"
MARKER = "COMPLETE"
#: The folder of ``phase``'s default cache (``OUT/cache``): a link there is refused too.
CACHE = "cache"
#: Names a run of this toolkit leaves in a folder: their presence marks it as ours.
OWN_NAMES = (LOCK_NAME, MANIFEST, MARKER)
#: Top-level files of ``reproduce`` (and of a run folder of a version without a manifest,
#: whose marker then vouches for these names only).
OUTPUT_NAMES = ("table.parquet", "table.csv", "claims.json", "config.json", "report.html", "report.md")
#: Every file a command writes into an output folder, as ``/``-separated patterns (``*``
#: within one name); a manifest naming anything else is refused.
PRODUCED = (*OUTPUT_NAMES, "plots/*.png",
            "phase.parquet", "heatmap.png", "heatmap_*.png",
            "probe.csv", "probe.json", "probe.png", "windows.npz", "windows_*.npz", "geometry.md", "geometry.png",
            "attentions.npz", "influence.csv", "influence.json", "states.safetensors", "states.json",
            "result.json", "mu_loglog.png",
            "schedules.csv", "schedules.json", "schedules.png",
            "system.json", "portrait_2d.png", "trajectories_3d.png",
            "mask.png", "mask.pdf", "mask.svg", "compare.csv")

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC


def produced(rel: object) -> bool:
    """Whether ``rel`` is a relative, normalised ``/``-separated path matching :data:`PRODUCED`."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\0" in rel or PurePosixPath(rel).as_posix() != rel:
        return False
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return False
    return any(len(pat) == len(parts) and all(map(fnmatchcase, parts, pat))
               for pat in (p.split("/") for p in PRODUCED))


def _folders() -> list[str]:
    """The fixed folders of :data:`PRODUCED` (``plots``)."""
    return sorted({"/".join(p.split("/")[:k]) for p in PRODUCED for k in range(1, p.count("/") + 1)})


def _refuse_link(out: Path, rel: str, what: str) -> UnsafePathError:
    return UnsafePathError(f"{str(out / rel)!r} is {what} where this run would write; refused (a run follows no "
                           "link in its output folder and writes only regular files): remove it or choose another --out")


def _open_dir(out: Path, root: int, parts: list[str], *, create: bool = False) -> int | None:
    """A descriptor of ``out/parts`` reached from ``root`` without following a link (None:
    absent and not ``create``)."""
    fd = os.dup(root)
    try:
        for k, name in enumerate(parts):
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(name, 0o777, dir_fd=fd)
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    kind = "a symbolic link" if exc.errno == errno.ELOOP or _is_link(fd, name) else "not a folder"
                    raise _refuse_link(out, "/".join(parts[:k + 1]), kind) from None
                raise
            os.close(fd)
            fd = sub
        return fd
    except BaseException:
        os.close(fd)
        raise


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _state(out: Path, root: int, rel: str) -> str:
    """``"absent"`` or ``"file"`` for ``out/rel``; anything else on the way is refused."""
    parts = rel.split("/")
    fd = _open_dir(out, root, parts[:-1])
    if fd is None:
        return "absent"
    try:
        st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return "absent"
    finally:
        os.close(fd)
    if stat.S_ISREG(st.st_mode):
        return "file"
    raise _refuse_link(out, rel, "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file")


@contextmanager
def _root(out: Path) -> Iterator[int]:
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def manifest(out: str | os.PathLike) -> set[str]:
    """The files the last run published into ``out`` (:data:`OUTPUT_NAMES` for a finished run
    without a manifest); :class:`UnsafePathError` for a manifest that is not a list of produced names."""
    out = Path(out)
    path = out / MANIFEST
    try:
        raw = read_regular(path, "manifest")
    except FileNotFoundError:
        try:
            legacy = stat.S_ISREG(os.lstat(out / MARKER).st_mode)
        except OSError:
            legacy = False
        return set(OUTPUT_NAMES) if legacy else set()
    try:
        listed = json.loads(raw)
    except (ValueError, RecursionError):
        listed = None
    if not isinstance(listed, list):
        raise UnsafePathError(f"manifest {str(path)!r} is not a list of file names; refused (nothing in the folder "
                              "is removed): delete it, or choose another --out")
    bad = [p for p in listed if not produced(p)]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UnsafePathError(f"manifest {str(path)!r} lists {excerpt(bad[0])}{more}, not a file this toolkit writes; "
                              "refused (nothing in the folder is removed): delete the manifest, or choose another --out")
    return set(listed)


def check_out(out: str | os.PathLike, names: Iterable[str] = (), *, allow_nonempty: bool = False,
              flags: bool | str = False) -> set[str]:
    """Check, touching nothing, that a run may write ``names`` into ``out``; returns the
    previous run's files (:func:`manifest`). :class:`ConfigError` when ``out`` cannot be a folder,
    is non-empty and no run wrote it (unless ``allow_nonempty``), or holds files of ``names`` no
    run wrote (with ``flags``, naming ``--out`` or the flag ``flags`` gives, and ``--allow-nonempty``);
    :class:`UnsafePathError` for a link or non-regular file where the run would write, or an
    untrusted manifest."""
    out = Path(out)
    option = flags if isinstance(flags, str) else ("--out" if flags else "out")
    check_writable(out, folder=True, option=option)
    if not out.is_dir():
        return set()
    found = set() if allow_nonempty else {p.name for p in out.iterdir()}
    if found and not found & set(OWN_NAMES):  # a run would mix its outputs with files it does not know
        allow = "--allow-nonempty" if flags else "allow_nonempty=True"
        raise ConfigError(f"{option} {str(out)!r} is a non-empty folder that no run wrote ({len(found)} entries); "
                          f"choose a new or empty folder, or pass {allow} to write beside its files")
    old = manifest(out)
    names = sorted(set(names))
    bad = [n for n in names if not produced(n)]
    if bad:
        raise ConfigError(f"{bad[0]!r} is not a name this toolkit writes into an output folder")
    with _root(out) as root:
        for rel in (LOCK_NAME, MARKER):
            _state(out, root, rel)  # a planted link or FIFO is refused here, not opened later
        for folder in (*_folders(), CACHE):
            fd = _open_dir(out, root, folder.split("/"))
            if fd is not None:
                os.close(fd)
        states = {rel: _state(out, root, rel) for rel in sorted(old | set(names))}
    _refuse_clashes(out, [n for n in names if states[n] == "file" and n not in old], option)
    return old


def _refuse_clashes(out: Path, clashes: list[str], option: str) -> None:
    if clashes:
        shown = ", ".join(clashes[:5]) + (f" (and {len(clashes) - 5} more)" if len(clashes) > 5 else "")
        raise ConfigError(f"{str(out)!r} holds files no run wrote that this run would replace: {shown}; "
                          "move them or choose another folder", argument=option)


class OutputFolder:
    """The lock on output folder ``out``, a context manager whose entry first checks the folder
    (:func:`check_out`, same ``names``, ``allow_nonempty``, ``flags``). With ``wait``, a folder held
    by another live run is polled every ``poll_s`` seconds, else :class:`OutputBusyError` naming it.
    """

    def __init__(self, out: str | os.PathLike, names: Iterable[str] = (), *, wait: bool = False, poll_s: float = 1.0,
                 allow_nonempty: bool = False, flags: bool | str = False) -> None:
        self.out, self.wait, self.poll_s = Path(out), bool(wait), float(poll_s)
        self.names, self.allow_nonempty, self.flags = tuple(names), bool(allow_nonempty), flags
        self._fd: int | None = None
        self._fresh = False

    def __enter__(self) -> "OutputFolder":
        check_out(self.out, self.names, allow_nonempty=self.allow_nonempty, flags=self.flags)
        # a folder this run makes (absent or empty before) is removed again by a failure
        self._fresh = not self.out.exists() or (self.out.is_dir() and not any(self.out.iterdir()))
        self.out.mkdir(parents=True, exist_ok=True)
        fd = open_private(self.out / LOCK_NAME, "lock file")
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not self.wait:
                    os.close(fd)
                    info = owner(self.out)
                    holder = f"run pid {info.get('pid')} on host {info.get('host')} since {info.get('started')}"
                    raise OutputBusyError(f"{self.out} is in use by {holder if info else 'another run'}; "
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
            # a failed run in a folder it made leaves nothing behind (docs/errors.md)
            (self.out / LOCK_NAME).unlink(missing_ok=True)
            _remove_empty(self.out)
        # else the lock file stays (a waiter could lock an unlinked file); closing releases the lock
        os.close(self._fd)
        self._fd = None


@contextmanager
def writing(out: str | os.PathLike, marker_text: str, names: Iterable[str] = (), *, allow_nonempty: bool = False,
            flags: bool | str = True, wait: bool = False, keep: bool = False) -> Iterator[Path]:
    """Hold ``out`` (:class:`OutputFolder`) and yield a staging folder, published (:func:`publish`)
    when the block ends without error."""
    with OutputFolder(out, names, wait=wait, allow_nonempty=allow_nonempty, flags=flags) as folder:
        with staged(folder.out, marker_text, keep=keep) as stage:
            yield stage


@contextmanager
def staged(out: Path, marker_text: str, *, keep: bool = False) -> Iterator[Path]:
    """A fresh staging folder in ``out`` (held), published with ``marker_text`` if the block succeeds."""
    stage = staging_folder(out)
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    publish(out, stage, marker_text, keep=keep)


def _remove_empty(folder: Path) -> None:
    """Remove ``folder`` and the folders under it that hold no file (bottom up)."""
    for sub in [*sorted((p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink()), reverse=True), folder]:
        try:
            sub.rmdir()
        except OSError:  # holds a file: kept
            pass


def owner(out: str | os.PathLike) -> dict[str, Any]:
    """The owner recorded in ``out``'s lock file (``{}`` if none or unreadable)."""
    try:
        info = json.loads(read_regular(Path(out) / LOCK_NAME, "lock file") or b"{}")
    except (OSError, ValueError):  # UnsafePathError is a ValueError: an unsafe lock names no owner
        return {}
    return info if isinstance(info, dict) else {}


def remove_orphan_tmp(out: Path) -> None:
    """Delete what killed writers left in ``out`` and its fixed folders: temporary files
    (:data:`~rankcollapse._io.TMP_SUFFIX`) and a staging folder. Hold the lock."""
    for folder in (out, *(out / f for f in _folders())):
        if folder.is_dir() and not folder.is_symlink():
            for tmp in folder.glob(f".*{TMP_SUFFIX}"):
                tmp.unlink(missing_ok=True)
    staging = out / STAGING
    if staging.is_dir() and not staging.is_symlink():
        shutil.rmtree(staging)


def staging_folder(out: Path) -> Path:
    """A fresh, empty staging folder inside ``out`` (publishing is renames only). Hold the lock."""
    staging = out / STAGING
    if staging.is_symlink():
        staging.unlink()
    elif staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    return staging


def publish(out: Path, staging: Path, marker_text: str, *, keep: bool = False) -> None:
    """Move the files of ``staging`` into ``out``, remove those the previous manifest lists
    that this run did not write (unless ``keep``: a folder gathering several commands'
    files), then write the manifest and, last, the ``COMPLETE`` marker (removed before the
    first move). Every name is checked first; hold the lock. :class:`ConfigError` for a file
    this run would replace that the previous run did not write (each named);
    :class:`UnsafePathError` as :func:`check_out`, or for a staged name this version does not declare.
    """
    new = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    try:
        undeclared = [rel for rel in new if not produced(rel)]
        if undeclared:
            raise UnsafePathError(f"{undeclared[0]!r} is not a name this toolkit writes into an output folder")
        old = manifest(out)
        with _root(out) as root:
            states = {rel: _state(out, root, rel) for rel in sorted(old | set(new) | {MARKER})}
            _refuse_clashes(out, [rel for rel in new if states[rel] == "file" and rel not in old], "output folder")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    with _root(out) as root:
        if states[MARKER] == "file":
            os.unlink(MARKER, dir_fd=root)
        # listed before they move: a run killed while publishing leaves no file unlisted
        write_json_atomic(out / MANIFEST, sorted(old | set(new)))
        for rel in new:
            *folders, name = rel.split("/")
            src = os.open(staging.joinpath(*folders), _DIR_FLAGS) if folders else os.open(staging, _DIR_FLAGS)
            dst = _open_dir(out, root, folders, create=True)
            try:
                os.replace(name, name, src_dir_fd=src, dst_dir_fd=dst)
            finally:
                os.close(src)
                os.close(dst)
        for rel in sorted(set() if keep else old - set(new)):
            if states[rel] != "file":
                continue
            *folders, name = rel.split("/")
            fd = _open_dir(out, root, folders)
            if fd is None:
                continue
            try:
                os.unlink(name, dir_fd=fd)
            finally:
                os.close(fd)
            while folders:  # folders the removal left empty go too
                last = folders.pop()
                fd = _open_dir(out, root, folders)
                try:
                    os.rmdir(last, dir_fd=fd)
                except OSError:  # holds a file (a user's own, or a new output)
                    break
                finally:
                    os.close(fd)
    shutil.rmtree(staging, ignore_errors=True)
    write_json_atomic(out / MANIFEST, sorted(old | set(new)) if keep else new)
    write_text_atomic(out / MARKER, marker_text)
