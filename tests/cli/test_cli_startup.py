"""Start-up: `--help`, `--version` and `mask describe` run without torch or transformers.

The torch-free commands run one after another in one fresh interpreter, which reports
after each which heavy modules are in ``sys.modules`` (modules only accumulate, so a
command that imports one is seen at that command); ``benchmarks/bench_startup.py``
measures the time. A command that needs torch (``metrics`` of a saved array) is the
positive control: the check sees it.
"""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import rankcollapse

HEAVY = ("torch", "transformers")
ROOT = Path(__file__).resolve().parents[2]

# runs each argument vector of the JSON list argv[1] in turn, one JSON line per run
_PROBE = """
import io, json, sys, contextlib
from rankcollapse.cli import run
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run(argv)
    print(json.dumps({"code": code, "stdout": out.getvalue(),
                      "heavy": sorted(m for m in %r if m in sys.modules)}))
""" % (HEAVY,)


def _runs(*argvs: list[str]) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argvs)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()[-len(argvs):]]


def _run(*argv: str) -> dict:
    return _runs(list(argv))[0]


TORCH_FREE = [
    ["--help"],
    ["--version"],
    ["mask", "--help"],
    ["probe", "--help"],
    ["simulate", "--help"],
    ["mask", "describe", "causal_sliding_window:w=9", "--n-tokens", "64"],
    ["mask", "describe", "longformer:w=5,globals=0+7", "--n-tokens", "24", "--format", "json"],
    ["mask", "describe", "documents:lengths=3+5+8", "--n-tokens", "16", "--format", "json"],
    ["mask", "describe", "schedule:sliding_window:w=9*5,complete", "--n-tokens", "64", "--format", "json"],
]


@pytest.fixture(scope="module")
def torch_free_runs() -> list[dict]:
    """Every argument vector of TORCH_FREE, in order, in one fresh interpreter."""
    return _runs(*TORCH_FREE)


@pytest.mark.parametrize("k", range(len(TORCH_FREE)), ids=[" ".join(argv) for argv in TORCH_FREE])
def test_command_imports_neither_torch_nor_transformers(torch_free_runs, k):
    got = torch_free_runs[k]
    assert got["code"] == 0
    assert got["heavy"] == []


def test_positive_control_a_command_that_needs_torch_is_seen(tmp_path):
    np.save(tmp_path / "X.npy", np.random.default_rng(0).standard_normal((6, 4)))
    got = _run("metrics", str(tmp_path / "X.npy"), "--metrics", "mu", "--format", "json")
    assert got["code"] == 0
    assert got["heavy"] == ["torch"]


def test_version_prints_the_package_version():
    got = _run("--version")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert got["stdout"] == f"rankcollapse {declared}\n"
    assert rankcollapse.__version__ == declared


def test_module_entry_point_runs_the_cli():
    proc = subprocess.run([sys.executable, "-m", "rankcollapse.cli", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == f"rankcollapse {rankcollapse.__version__}\n"


def test_an_input_that_is_no_regular_file_is_refused_before_torch(tmp_path):
    import os

    os.mkfifo(tmp_path / "w.npz")
    for flag in ("--windows-file", "--text-file"):
        got = _run("probe", "--model", "minilm", flag, str(tmp_path / "w.npz"))
        assert got["code"] == 2 and got["heavy"] == []
