"""The windowed kernel's native part (``_banded.c``), built once at install time.

``python -m rankcollapse.dynamics.native`` (run by ``make setup``) compiles ``_banded.c``
with the C compiler (``$CC``, else ``cc``) against the BLAS inside torch's own library, into
a cache folder keyed by the source, the torch version, the flags and the CPU. :func:`banded_kernel`
only loads a library built before: nothing is compiled at run time, and without a compiler
(or a torch without ``sgemm_``) it returns None and :func:`~.sparse.blocked_attention` keeps
its torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("_banded.c")
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp-simd", "-fPIC", "-shared")


def _cpu_flags() -> bytes:
    """The CPU's feature flags (Linux), part of the key: ``-march=native`` code runs on its own CPU only."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            return next((line for line in f if line.startswith(b"flags")), b"")
    except OSError:
        return b""


def library_path() -> Path:
    """Where the library of this source, torch version and flags lives (``$XDG_CACHE_HOME``
    or ``~/.cache``, then ``rankcollapse/native``)."""
    key = hashlib.sha256(b"\0".join((SOURCE.read_bytes(), torch.__version__.encode(), " ".join(FLAGS).encode(),
                                     platform.machine().encode(), _cpu_flags()))).hexdigest()[:16]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "rankcollapse" / "native" / f"banded-{key}.so"


def build() -> Path:
    """Compile :data:`SOURCE` to :func:`library_path` (kept if there already); raises
    ``RuntimeError`` with the compiler's message when it cannot."""
    target = library_path()
    if target.exists():
        return target
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler ({cc!r} not found)")
    lib = Path(torch.__file__).parent / "lib"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        part = Path(tmp) / target.name
        cmd = [cc, *FLAGS, str(SOURCE), "-o", str(part), f"-L{lib}", "-ltorch_cpu", f"-Wl,-rpath,{lib}",
               "-lmvec", "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
        os.replace(part, target)  # whole or absent, also with builds in parallel
    return target


@functools.cache
def banded_kernel():
    """The ctypes function ``banded_blocks_f32`` of the library built before, or None."""
    path = library_path()
    if not path.exists():
        return None
    try:
        fn = ctypes.CDLL(str(path)).banded_blocks_f32
    except (OSError, AttributeError):
        return None
    p, i64, i32 = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    fn.argtypes = [p, i64, p, i64, p, i64, p, i64, i64, i64, i32, i32, i64, i64, i32, i32, p, p, ctypes.c_float]
    fn.restype = i32
    return fn


if __name__ == "__main__":
    try:
        print(f"rankcollapse native kernel: {build()}")
    except (RuntimeError, OSError) as e:
        print(f"rankcollapse native kernel not built ({e}); the torch path is used", file=sys.stderr)
