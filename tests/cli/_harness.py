"""In-process CLI runs and a folder of good and bad inputs, for the property tests."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from rankcollapse.cli import run

_RUNNER = CliRunner()
# a NaN or inf printed as a number (not inside words such as "info" or "undefined")
_NONFINITE = re.compile(r"(?<![A-Za-z_])-?(nan|inf|infinity)(?![A-Za-z_])", re.IGNORECASE)
# a Python warning printed by the warnings module ("...: RuntimeWarning: overflow ...")
_WARNING = re.compile(r"\b[A-Z]\w*Warning: ")


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def invoke(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run ``rankcollapse argv`` in-process in ``cwd``: (exit status, stdout, stderr).
    A Python warning the run raises is printed on stderr as a fresh interpreter would
    print it (pytest would otherwise record it out of sight)."""
    with _cwd(cwd), _RUNNER.isolation() as streams, warnings.catch_warnings(record=True) as caught:
        code = run(argv)
        for w in caught:
            sys.stderr.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line))
        sys.stdout.flush()
        sys.stderr.flush()
        out, err = streams[0].getvalue().decode(), streams[1].getvalue().decode()
    return code, out, err


def run_cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """:func:`invoke` (in the current folder by default) as a ``CompletedProcess``, the
    shape of ``subprocess.run(..., capture_output=True, text=True)``: one real process
    per command is enough, the other runs of that command stay in this one."""
    code, out, err = invoke(list(argv), Path.cwd() if cwd is None else cwd)
    return subprocess.CompletedProcess(list(argv), code, out, err)


def snapshot(root: Path) -> set[str]:
    """Every path under ``root`` (files and folders), relative."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def remove_new(root: Path, before: set[str]) -> None:
    """Delete what a successful run added under ``root``, deepest first."""
    for rel in sorted(snapshot(root) - before, key=len, reverse=True):
        p = root / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink()


def check_run(argv: list[str], root: Path) -> tuple[int, str, str]:
    """Run and assert the contract: exit 0 or 2, one line and no traceback on error,
    strict JSON, no non-finite number printed and no Python warning on stderr after a
    success, nothing left behind after a failure."""
    before = snapshot(root)
    code, out, err = invoke(argv, root)
    where = f"rankcollapse {' '.join(argv)}\nstdout: {out[-500:]}\nstderr: {err[-800:]}"
    assert code in (0, 2), where
    assert "Traceback" not in err and "internal error" not in err, where
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("rankcollapse: error: "), where
        assert snapshot(root) == before, f"left behind {snapshot(root) - before}: {where}"
    else:
        if wants_json(argv):
            json.loads(out, parse_constant=_reject)
        assert not _NONFINITE.search(out), where
        assert not _WARNING.search(err), f"a warning leaked onto a successful command: {where}"
        remove_new(root, before)
    return code, out, err


def wants_json(argv: list[str]) -> bool:
    """Whether ``argv`` asks for JSON on stdout (``--format json``)."""
    return any(a == "--format" and b == "json" for a, b in zip(argv, argv[1:])) \
        or "--format=json" in argv


def _reject(token: str):
    raise AssertionError(f"non-strict JSON token {token}")


def make_inputs(root: Path) -> Path:
    """Good and bad input files under ``root``."""
    rng = np.random.default_rng(0)
    np.save(root / "good.npy", rng.standard_normal((6, 4)))
    np.save(root / "batch.npy", rng.standard_normal((2, 5, 3)))
    np.save(root / "huge.npy", rng.random((6, 4)) * 1e300)
    v = np.arange(1.0, 5.0)
    np.save(root / "antipodal.npy", np.stack([v, -v, 2 * v, -2 * v]))
    np.save(root / "zeros.npy", np.zeros((4, 3)))
    np.save(root / "pad.npy", np.array([True, True, False, True, True, True]))
    np.save(root / "mask6.npy", np.tril(np.ones((6, 6), dtype=bool)))
    (root / "empty.npy").write_bytes(b"")
    np.save(root / "strings.npy", np.array(["a", "b"]))
    np.save(root / "dates.npy", np.array(["2020-01-01"], dtype="datetime64[D]"))
    np.save(root / "records.npy", np.zeros(3, dtype=[("a", "f8"), ("b", "i4")]))
    np.save(root / "bigendian.npy", rng.standard_normal((6, 4)).astype(">f8"))
    np.savez(root / "archive.npz", a=np.zeros((4, 4)))
    nan = rng.standard_normal((6, 4))
    nan[2, 1] = np.nan
    np.save(root / "nan.npy", nan)
    (root / "edges.txt").write_text("0 0\n1 0\n1 1\n2 1\n2 2\n3 2\n3 3\n4 3\n4 4\n5 4\n5 5\n")
    (root / "edges_dashes.txt").write_text("--1 0\n")
    (root / "edges_super.txt").write_text("1 0\n\u00b2 1\n")
    system = {"mask": "causal", "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[0.5, 0], [0, 2]]}
    (root / "system.json").write_text(json.dumps(system))
    (root / "system_abc.json").write_text(json.dumps({**system, "d_qk": "abc"}))
    (root / "system_null.json").write_text(json.dumps({**system, "d_qk": None}))
    (root / "system_nan.json").write_text(json.dumps({**system, "W_V": [[float("nan"), 0], [0, 1]]}))
    (root / "notjson.json").write_text("{")
    (root / "afile").write_text("a file where a folder may be expected\n")
    (root / "adir").mkdir()
    (root / "ro").mkdir()
    os.chmod(root / "ro", 0o555)
    return root
