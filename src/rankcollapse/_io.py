"""Reproducibility plumbing: atomic writes, config hashes, version records."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import platform
import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

_VERSIONED = ("rankcollapse", "torch", "numpy", "scipy", "networkx", "transformers", "pandas", "matplotlib")


#: Suffix of the temporary files of :func:`atomic_path`: cleaners remove only files with
#: it, never a user's own ``.draft.tmp``.
TMP_SUFFIX = ".rankcollapse.tmp"


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto ``path`` only if
    the block finishes, so a crash never leaves a half-written file under the real name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented strict JSON atomically (NaN and infinities as null,
    see :func:`strict_json`)."""
    text = json.dumps(strict_json(obj), indent=2, sort_keys=False, allow_nan=False, default=_json_default)
    write_text_atomic(path, text + "\n")


def strict_json(obj: Any) -> Any:
    """``obj`` ready for strict JSON (RFC 8259 has no NaN/Infinity): non-finite floats
    become None; numpy/torch values (``tolist``) become plain numbers and lists; paths
    become text. Containers are copied, never changed in place."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else str(k): strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if hasattr(obj, "tolist"):
        return strict_json(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def config_hash(config: Any, length: int = 12) -> str:
    """SHA-256 of the canonical JSON of ``config`` (sorted keys), first ``length`` hex digits."""
    blob = json.dumps(config, sort_keys=True, default=_json_default, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


#: Bytes read at a time by :func:`file_sha256`.
_HASH_CHUNK = 1 << 20
#: ``{(path, size, mtime_ns, inode): digest}`` of the files hashed in this process.
_DIGESTS: dict[tuple, str] = {}
#: A file modified less than this many nanoseconds before it is hashed is not remembered:
#: a file system's coarse timestamps could give a second write within that time the
#: same ``mtime_ns`` (git's "racily clean" files).
_SETTLED_NS = 2_000_000_000


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (64 hex digits) of the bytes of the file ``path`` (a link is followed),
    read in chunks. The digest is what a cache key holds; it is remembered per process
    by ``(path, size, mtime_ns, inode)``, so a file read again unchanged is not hashed
    again and a file rewritten in place (new size, mtime or inode) is; a file written
    in the last two seconds is hashed every time (:data:`_SETTLED_NS`).

    Raises
    ------
    OSError
        The file cannot be read.
    """
    st = os.stat(path)
    memo = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if memo in _DIGESTS:
        return _DIGESTS[memo]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    if time.time_ns() - st.st_mtime_ns > _SETTLED_NS:
        _DIGESTS[memo] = h.hexdigest()
    return h.hexdigest()


def versions() -> dict[str, str]:
    """Versions of Python and the packages that determine the numbers."""
    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def load_npy(path: str | os.PathLike, what: str, *, error: type[Exception] | None = None):
    """The numeric array saved in the ``.npy`` file ``path`` (numpy, native byte order).

    One loader for every array the toolkit reads (token arrays, padding masks, mask
    matrices), so each refuses bad files the same way. Big-endian arrays are converted
    to native order; no pickles are ever loaded.

    Raises
    ------
    error (default :class:`~rankcollapse.errors.DataError`)
        Naming ``what`` and ``path``: missing or not a file, empty (0 bytes), truncated
        or not ``.npy``, an ``.npz`` archive, or a dtype that is not bool/int/float
        (strings, datetimes, objects, structured records, complex).
    """
    import numpy as np

    from .errors import DataError

    error = error or DataError
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} {str(path)!r} does not exist or is not a file")
    if path.stat().st_size == 0:
        raise error(f"{what} {str(path)!r} is empty (0 bytes)")
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        # numpy's own text for pickles suggests loading them unsafely: never repeat it
        why = ("it is not a .npy file or holds pickled Python objects, which are refused "
               "(unpickling can run code)") if "pickle" in str(exc) else str(exc)
        raise error(f"{what} {str(path)!r} is not a readable .npy array: {why}") from None
    if not isinstance(arr, np.ndarray):  # np.load opens .npz archives lazily
        arr.close()
        raise error(f"{what} {str(path)!r} is an .npz archive; save one array with numpy.save (.npy)")
    dt = arr.dtype
    if dt.names is not None or dt.kind not in "biuf":
        raise error(f"{what} {str(path)!r} holds dtype {dt.str} ({dt}); expected bool, integer or float")
    if not dt.isnative:
        arr = arr.astype(dt.newbyteorder("="))
    return arr


def read_regular(path: str | os.PathLike, what: str = "file") -> bytes:
    """The bytes of ``path``, which must be a regular file reached without a symbolic link
    in its last component: the toolkit's own records (cache entries, ``claims.json``,
    lock files) are read only through this, so a planted link to a system file or a FIFO
    is refused instead of opened, parsed or waited on.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist (callers decide whether that is an error).
    UnsafePathError
        ``path`` is a symbolic link, or not a regular file (folder, FIFO, device).
    """
    import stat

    from .errors import UnsafePathError

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"{what} {str(path)!r} is a symbolic link; refused (the toolkit "
                                  "reads only regular files it could have written)") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePathError(f"{what} {str(path)!r} is not a regular file; refused")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_user_json(path: str | os.PathLike, what: str, error: type | None = None) -> Any:
    """Parse a user's JSON file (a link to it is fine) with every failure one typed line:
    not a regular file (a FIFO is refused at once instead of waited on), not UTF-8, not
    JSON, a key given twice in one object, nested too deep for the parser, or numbers
    outside float range.

    Raises
    ------
    error (default :class:`~rankcollapse.errors.DataError`)
        Naming ``what``, the path and the reason.
    """
    import stat

    from .errors import DataError

    error = error or DataError
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{what} {str(path)!r} is not a regular file (a FIFO, device or folder); refused")
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw = fh.read()
    finally:
        os.close(fd)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {str(path)!r} is not valid UTF-8 (byte {exc.start}); save it as UTF-8") from None
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        twice = next((k for k in keys if keys.count(k) > 1), None)
        if twice is not None:  # the later value would silently win
            raise error(f"{what} {str(path)!r} gives the key {twice!r} twice in one object")
        return dict(pairs)

    try:
        return json.loads(text, object_pairs_hook=unique)
    except RecursionError:
        raise error(f"{what} {str(path)!r} is nested too deeply to be a {what}") from None
    except ValueError as exc:  # JSONDecodeError, and integers too long to convert
        raise error(f"{what} {str(path)!r} is not valid JSON ({str(exc).splitlines()[0][:120]})") from None


@contextmanager
def read_as(path: str | os.PathLike, what: str) -> Iterator[None]:
    """Read a user's file of records (``claims.json``) inside this block: a record whose
    shape is not the one a run writes (a string where a list of checks is expected, a
    check without its outcome) stops the reader with an error of the toolkit's own code
    (``AttributeError``, ``TypeError``, ``KeyError``, ``IndexError``); it is raised as one
    :class:`~rankcollapse.errors.ConfigError` naming the file.

    Raises
    ------
    ConfigError
        ``path`` is not a ``what`` a run writes (the message names the first problem).
    """
    from .errors import ConfigError, excerpt

    try:
        yield
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        raise ConfigError(f"{str(path)!r} is not a {what} a run writes ({type(exc).__name__}: "
                          f"{excerpt(exc, 80)})") from None


def open_private(path: str | os.PathLike, what: str = "file") -> int:
    """A read-write descriptor of ``path`` (created ``0o644`` if missing) that never
    follows a symbolic link and is a regular file: writing through it can never reach
    another file (a lock file planted as a link to ``/etc/passwd`` is refused).

    Raises
    ------
    UnsafePathError
        ``path`` is a symbolic link or not a regular file.
    """
    import stat

    from .errors import UnsafePathError

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"{what} {str(path)!r} is a symbolic link; refused (the toolkit "
                                  "never writes through a link it did not create)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"{what} {str(path)!r} is not a regular file; refused")
    return fd


def check_writable(path: str | os.PathLike, *, folder: bool, option: str = "--out") -> Path:
    """Check, before any work, that ``path`` can be written: a folder (``folder=True``)
    must not be an existing file; a file must not be an existing folder; the nearest
    existing ancestor must be a writable folder (no file in the way). Creates nothing.

    Raises
    ------
    ConfigError
        Naming ``option``, the path and what is in the way.
    """
    from .errors import ConfigError

    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {str(path)!r} is an existing file, not a folder")
    if not folder and path.is_dir():
        raise ConfigError(f"{option} {str(path)!r} is an existing folder, not a file")
    parent = path if folder else path.parent
    parent = Path(os.path.abspath(parent))
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{option} {str(path)!r}: {str(parent)!r} is a file where a folder is needed")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {str(path)!r}: the folder {str(parent)!r} is not writable")
    return path
