"""Reproducibility plumbing: atomic writes, config hashes, version records."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import platform
import stat
import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from .errors import ConfigError, DataError, UnsafePathError, excerpt

_VERSIONED = ("rankcollapse", "torch", "numpy", "scipy", "networkx", "transformers", "pandas", "matplotlib")
#: Suffix of :func:`atomic_path`'s temporary files: cleaners remove only these, never a user's ``.tmp``.
TMP_SUFFIX = ".rankcollapse.tmp"


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path``, renamed onto it only if the block finishes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; give the usual mode
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented strict JSON atomically (:func:`strict_json`)."""
    text = json.dumps(strict_json(obj), indent=2, sort_keys=False, allow_nan=False, default=_json_default)
    write_text_atomic(path, text + "\n")


def strict_json(obj: Any) -> Any:
    """A copy of ``obj`` for strict JSON (RFC 8259): non-finite floats as None, numpy/torch
    values as plain numbers and lists, paths as text."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else str(k): strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if hasattr(obj, "tolist") or isinstance(obj, Path):
        return strict_json(_json_default(obj))
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


#: ``{(path, size, mtime_ns, inode): digest}`` of the files hashed in this process.
_DIGESTS: dict[tuple, str] = {}
#: A file modified less than this long before it is hashed is not remembered: coarse
#: timestamps could give a second write the same ``mtime_ns`` (git's "racily clean" files).
_SETTLED_NS = 2_000_000_000


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (64 hex digits) of the file ``path``, remembered per process by
    ``(path, size, mtime_ns, inode)`` once settled (:data:`_SETTLED_NS`); raises ``OSError``."""
    st = os.stat(path)
    memo = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if memo in _DIGESTS:
        return _DIGESTS[memo]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
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
    """The bool/int/float array of the ``.npy`` file ``path`` in native byte order (never a pickle);
    ``error`` (default :class:`~rankcollapse.errors.DataError`) naming ``what`` and ``path``: not a
    file, empty, not a ``.npy`` array, or another dtype."""
    import numpy as np

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
    if not isinstance(arr, np.ndarray):  # np.load opens any zip archive lazily as an .npz
        kind = "an .npz archive" if all(n.endswith(".npy") for n in arr.zip.namelist()) else \
            "a zip archive, not .npz (a torch.save file? name it .pt)"
        arr.close()
        raise error(f"{what} {str(path)!r} is {kind}; save one array with numpy.save (.npy)")
    dt = arr.dtype
    if dt.names is not None or dt.kind not in "biuf":
        raise error(f"{what} {str(path)!r} holds dtype {dt.str} ({dt}); expected bool, integer or float")
    if not dt.isnative:
        arr = arr.astype(dt.newbyteorder("="))
    return arr


def load_array(path: str | os.PathLike, what: str, *, error: type[Exception] | None = None):
    """The array of a ``.npy`` file (:func:`load_npy`) or the one tensor of a ``.pt`` file,
    read with ``torch.load(weights_only=True)`` (no pickled code runs).

    Raises
    ------
    error (default :class:`~rankcollapse.errors.DataError`)
        As :func:`load_npy`; for ``.pt``: not a file, unreadable, pickled objects other than
        tensors, or anything but one tensor.
    """
    path = Path(path)
    if path.suffix != ".pt":
        return load_npy(path, what, error=error)
    import pickle

    import torch

    error = error or DataError
    if not path.is_file():
        raise error(f"{what} {str(path)!r} does not exist or is not a file")
    try:
        X = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:  # torch's text suggests loading it unsafely: never repeat it
        raise error(f"{what} {str(path)!r} holds pickled Python objects other than tensors, which are refused "
                    "(unpickling can run code); save one tensor with torch.save") from None
    except Exception as exc:  # noqa: BLE001 - zip, pickle, numpy and torch errors differ
        raise error(f"{what} {str(path)!r} is not a readable .pt tensor: "
                    f"{(str(exc).splitlines() or [''])[0][:200]}") from None
    if not isinstance(X, torch.Tensor):
        raise error(f"{what} {str(path)!r} holds a {type(X).__name__}, not one tensor")
    return X


def read_regular(path: str | os.PathLike, what: str = "file") -> bytes:
    """The bytes of ``path``, a regular file and not a symbolic link: how the toolkit reads its
    own records (cache entries, ``claims.json``, lock files). ``FileNotFoundError`` when ``path``
    does not exist (callers decide whether that is an error); :class:`UnsafePathError` for a
    symbolic link or a file that is not regular (folder, FIFO, device)."""
    fd = _open_regular(path, what, os.O_RDONLY, "reads only regular files it could have written")
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def read_user_text(path: str | os.PathLike, what: str, error: type | None = None) -> str:
    """The UTF-8 text of a user's regular file ``path`` (a link to it is fine; a byte order mark
    dropped); ``error`` (default :class:`~rankcollapse.errors.DataError`) naming ``what`` and the
    path: unreadable, not a regular file, not UTF-8."""
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
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {str(path)!r} is not valid UTF-8 (byte {exc.start}); save it as UTF-8") from None


def read_user_json(path: str | os.PathLike, what: str, error: type | None = None) -> Any:
    """A user's JSON file, parsed; ``error`` (default :class:`~rankcollapse.errors.DataError`)
    naming ``what`` and the path: as :func:`read_user_text`, not JSON, a key given twice, nested
    too deep, numbers out of range."""
    error = error or DataError
    text = read_user_text(path, what, error)

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
    """Read a user's file of records (``claims.json``) in this block: a record of another
    shape than a run writes (``AttributeError``, ``TypeError``, ``KeyError``, ``IndexError``
    in the reader) is raised as one :class:`~rankcollapse.errors.ConfigError` naming the file."""
    try:
        yield
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        raise ConfigError(f"{str(path)!r} is not a {what} a run writes ({type(exc).__name__}: "
                          f"{excerpt(exc, 80)})") from None


def open_private(path: str | os.PathLike, what: str = "file") -> int:
    """A read-write descriptor of the regular file ``path`` (created ``0o644`` if missing),
    never through a symbolic link; :class:`~rankcollapse.errors.UnsafePathError` otherwise."""
    return _open_regular(path, what, os.O_RDWR | os.O_CREAT, "never writes through a link it did not create")


def _open_regular(path: str | os.PathLike, what: str, flags: int, rule: str) -> int:
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"{what} {str(path)!r} is a symbolic link; refused (the toolkit "
                                  f"{rule})") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"{what} {str(path)!r} is not a regular file; refused")
    return fd


def check_writable(path: str | os.PathLike, *, folder: bool, option: str = "--out") -> Path:
    """Check, creating nothing, that ``path`` can be written as a folder (``folder``) or a
    file; :class:`~rankcollapse.errors.ConfigError` naming ``option`` and what is in the way."""
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {str(path)!r} is an existing file, not a folder")
    if not folder and path.is_dir():
        raise ConfigError(f"{option} {str(path)!r} is an existing folder, not a file")
    parent = Path(os.path.abspath(path if folder else path.parent))
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{option} {str(path)!r}: {str(parent)!r} is a file where a folder is needed")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {str(path)!r}: the folder {str(parent)!r} is not writable")
    return path
