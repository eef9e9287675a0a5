"""Output folders: every command writes into ``--out`` through this module, and only its own files.

Everything already in an output folder is untrusted input (a manifest may be edited, a
link planted, a user's file may carry one of the toolkit's names), so a run:

* writes and deletes only names this version produces (:data:`PRODUCED`), each reached
  from ``out`` one component at a time through directory descriptors opened with
  ``O_NOFOLLOW``: a symbolic link (or a device, a FIFO, a folder) anywhere on the way or
  at the name itself is refused, never followed. ``out`` itself is the user's path and
  may be a link;
* trusts its manifest (``.rankcollapse-manifest.json``, the files the last run wrote)
  only when every entry is such a name (relative, normalised, no ``..``): a manifest
  that is a link, not a list of names, or names anything else (``/home/me/x``,
  ``sub/keep.txt``, a user's ``notes.txt``) is refused before anything is touched;
* never replaces a file it did not write (one the manifest does not list): the run is
  refused, naming the clashes. The names known before the work (``report.html``,
  ``result.json``, a reproduce run's ``plots/<id>.png`` of every declared plot) are
  checked before it starts, the others (figures whose names follow from the results)
  before the first file is published.

One run at a time: a run holds an exclusive ``fcntl.flock`` on ``<out>/.rankcollapse.lock``
for its whole life; the file names the owner (pid, host, start time) for whoever finds it
taken. The kernel drops the lock when the owner dies (``kill -9`` included), so a lock
left by a dead run is taken over by the next one without any staleness guess. (``flock``
is per machine: two hosts writing one ``--out`` on a network file system are not
guarded; give each host its own ``--out`` and share only the cache.)

Whole runs only: a run builds every output in a staging folder inside ``out`` and
publishes it when complete (:func:`publish`): each file is renamed into place, the files
the previous run listed and this run did not write are removed, then the manifest and
the ``COMPLETE`` marker are written. A failure while building (a full disk) leaves the
previous run whole. A non-empty folder that no run of this toolkit wrote is refused
unless the caller allows it (``--allow-nonempty``); its files are then kept beside the
run's, and a file of the same name as one the run writes is still refused.
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
#: Every file a command of this version writes into an output folder, as ``/``-separated
#: patterns (``*`` matches within one name): ``reproduce``, ``phase``, ``probe``,
#: ``simulate``, ``reproduce schedules``, ``theory system`` / ``portrait``, ``mask show`` /
#: ``compare``. A manifest naming anything else is refused.
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
    """Whether ``rel`` is a name this version writes into an output folder: a relative,
    normalised ``/``-separated path (no ``..``, no ``.``, no empty part) matching one of
    :data:`PRODUCED` part by part."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\0" in rel or PurePosixPath(rel).as_posix() != rel:
        return False
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return False
    return any(len(pat) == len(parts) and all(map(fnmatchcase, parts, pat))
               for pat in (p.split("/") for p in PRODUCED))


def _folders() -> list[str]:
    """The fixed folders of :data:`PRODUCED` (``plots``): checked for links up front."""
    return sorted({"/".join(p.split("/")[:k]) for p in PRODUCED for k in range(1, p.count("/") + 1)})


def _refuse_link(out: Path, rel: str, what: str) -> UnsafePathError:
    return UnsafePathError(f"{str(out / rel)!r} is {what} where this run would write; refused (a run follows no "
                           "link in its output folder and writes only regular files): remove it or choose another --out")


def _open_dir(out: Path, root: int, parts: list[str], *, create: bool = False) -> int | None:
    """A descriptor of the folder ``out/parts`` reached from ``root`` without following a
    link (None when a folder on the way is absent and ``create`` is false)."""
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
    """``"absent"`` or ``"file"`` (a regular file) for ``out/rel``; anything else on the way
    (a link at any depth, a folder, a FIFO) is refused."""
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
    """The files the last run published into ``out`` (empty for none; for a finished run
    of a version without a manifest, :data:`OUTPUT_NAMES`).

    Raises
    ------
    UnsafePathError
        The manifest is a link or not a regular file, is not a JSON list, or lists a name
        this version does not write (the message quotes the first).
    """
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
    """Check, before any work and without touching anything, that a run may write ``names``
    into the output folder ``out``; returns the previous run's files (:func:`manifest`).

    ``out`` must be a folder that can be made; a non-empty one that no run wrote is refused
    unless ``allow_nonempty``; its manifest must name only files this version writes; no
    link may stand where a run would write or delete (the lock, the marker, ``plots/``, a
    listed file, one of ``names``); and none of ``names`` may be a file the previous run
    did not write.

    Raises
    ------
    ConfigError
        ``out`` cannot be a folder, or is foreign and non-empty, or holds files of
        ``names`` no run wrote (each named); with ``flags`` the message names the
        command line's ``--out`` (or the flag ``flags`` names, e.g. ``"--save-states"``)
        and ``--allow-nonempty``.
    UnsafePathError
        A link or non-regular file where the run would write, or an untrusted manifest.
    """
    out = Path(out)
    option = flags if isinstance(flags, str) else ("--out" if flags else "out")
    check_writable(out, folder=True, option=option)
    if not out.is_dir():
        return set()
    if not allow_nonempty:
        check_own_or_empty(out, flags=flags)
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
    """The lock on output folder ``out`` (a context manager). Entering checks the folder
    first (:func:`check_out`), so nothing is created in a folder that is refused.

    Parameters
    ----------
    names : the files the run is known to write (checked for clashes before any work).
    wait : when another live run holds the folder, wait for it instead of failing.
    poll_s : how often to retry while waiting.
    allow_nonempty : write into a non-empty folder that no run wrote, beside its files.
    flags : name the command line's options (``--out``, or the flag given as a string) in messages.

    Raises
    ------
    OutputBusyError
        On entry, when another live run holds ``out`` and ``wait`` is false; the message
        names its pid, host and start time.
    ConfigError, UnsafePathError
        On entry, as :func:`check_out`.
    """

    def __init__(self, out: str | os.PathLike, names: Iterable[str] = (), *, wait: bool = False, poll_s: float = 1.0,
                 allow_nonempty: bool = False, flags: bool | str = False) -> None:
        self.out, self.wait, self.poll_s = Path(out), bool(wait), float(poll_s)
        self.names, self.allow_nonempty, self.flags = tuple(names), bool(allow_nonempty), flags
        self._fd: int | None = None
        self._fresh = False

    @property
    def lock_path(self) -> Path:
        return self.out / LOCK_NAME

    def __enter__(self) -> "OutputFolder":
        check_out(self.out, self.names, allow_nonempty=self.allow_nonempty, flags=self.flags)
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


@contextmanager
def writing(out: str | os.PathLike, marker_text: str, names: Iterable[str] = (), *, allow_nonempty: bool = False,
            flags: bool | str = True, wait: bool = False, keep: bool = False) -> Iterator[Path]:
    """Hold ``out`` (:class:`OutputFolder`) and yield a staging folder to write the run's
    files into; they are published (:func:`publish`, ``keep`` as there) when the block
    ends without error, and dropped otherwise. For commands that write at the end."""
    with OutputFolder(out, names, wait=wait, allow_nonempty=allow_nonempty, flags=flags) as folder:
        with staged(folder.out, marker_text, keep=keep) as stage:
            yield stage


@contextmanager
def staged(out: Path, marker_text: str, *, keep: bool = False) -> Iterator[Path]:
    """A fresh staging folder inside ``out``, published with ``marker_text`` when the block
    ends without error (the previous run stays whole otherwise). Hold ``out`` first."""
    stage = staging_folder(out)
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    publish(out, stage, marker_text, keep=keep)


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


def check_own_or_empty(out: Path, *, flags: bool | str = False) -> None:
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
        o, allow = ((flags if isinstance(flags, str) else "--out"), "--allow-nonempty") if flags \
            else ("out", "allow_nonempty=True")
        raise ConfigError(f"{o} {str(out)!r} is a non-empty folder that no run wrote ({len(names)} entries); "
                          f"choose a new or empty folder, or pass {allow} to write beside its files")


def remove_orphan_tmp(out: Path) -> list[Path]:
    """Delete what killed writers of this toolkit left in ``out`` and ``out/plots``: their
    temporary files (``.<name>.*`` + :data:`~rankcollapse._io.TMP_SUFFIX`) and a staging
    folder. A ``plots`` that is a link is not entered. Call only while holding the lock.
    Returns the removed paths."""
    removed = []
    for folder in (out, *(out / f for f in _folders())):
        if not folder.is_dir() or folder.is_symlink():
            continue
        for tmp in folder.glob(f".*{TMP_SUFFIX}"):
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


def publish(out: Path, staging: Path, marker_text: str, *, keep: bool = False) -> list[Path]:
    """Move every file built in ``staging`` into ``out``, remove the files the previous
    run's manifest lists that this run did not write (never anything else), then write
    the manifest and, last, the ``COMPLETE`` marker. Returns the removed paths.

    With ``keep`` the listed files stay and the manifest lists them beside this run's:
    for commands that add one file (``mask show``, ``theory system``), so a folder can
    gather the outputs of several of them.

    Every name is checked first (a produced name, no link on the way, no file the
    previous run did not write), so a refusal leaves ``out`` as it was. The marker is
    removed before the first file moves, so a folder marked ``COMPLETE`` always holds
    exactly the files its manifest lists. Call only while holding the lock.

    Raises
    ------
    ConfigError
        A file this run would replace that the previous run did not write (each named).
    UnsafePathError
        As :func:`check_out`; or a staged name this version does not declare.
    """
    new = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    undeclared = [rel for rel in new if not produced(rel)]
    if undeclared:
        shutil.rmtree(staging, ignore_errors=True)
        raise UnsafePathError(f"{undeclared[0]!r} is not a name this toolkit writes into an output folder")
    try:
        old = manifest(out)
        with _root(out) as root:
            states = {rel: _state(out, root, rel) for rel in sorted(old | set(new) | {MARKER})}
            _refuse_clashes(out, [rel for rel in new if states[rel] == "file" and rel not in old], "output folder")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    removed = []
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
            removed.append(out / rel)
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
    return removed
