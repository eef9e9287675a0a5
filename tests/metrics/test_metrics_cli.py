"""`rankcollapse metrics FILE.npy` through the real console entry point."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from unittest.mock import patch

import numpy as np
import pytest

import metrics_numpy_reference as ref
from rankcollapse.metrics import METRICS

REQUIRED = ("mu", "mu_relative", "rank_fraction", "sigma_min", "avg_abs_cos",
            "stable_rank", "effective_rank", "rank_one_distance")


def _subprocess(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from rankcollapse.cli import main; sys.argv = ['rankcollapse', *sys.argv[1:]]; main()"
    return subprocess.run([sys.executable, "-c", code, "metrics", *args], capture_output=True, text=True, timeout=300)


def _run(*args: str) -> subprocess.CompletedProcess:
    """The console entry point ``main`` in-process, with ``sys.argv`` patched."""
    from rankcollapse.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with patch.object(sys, "argv", ["rankcollapse", "metrics", *args]), redirect_stdout(out), redirect_stderr(err):
        try:
            main()
        except SystemExit as exc:
            code = exc.code or 0
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics_cli")
    rng = np.random.default_rng(0)
    single, batch = rng.standard_normal((9, 5)), rng.standard_normal((3, 6, 4)).astype(np.float32)
    paths = {name: root / f"{name}.npy" for name in ("single", "batch", "pm", "nan", "bad_rank")}
    np.save(paths["single"], single)
    np.save(paths["batch"], batch)
    np.save(paths["pm"], np.array([[1, 1, 1, 1, 0, 0]] * 3))
    np.save(paths["nan"], np.full((3, 2), np.nan))
    np.save(paths["bad_rank"], np.zeros(4))
    return paths, single, batch


def test_json_single_matrix_matches_numpy(arrays):
    paths, single, _ = arrays
    proc = _run(str(paths["single"]), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(REQUIRED) <= set(out) and list(out) == list(METRICS)
    for name in REQUIRED:
        assert out[name] == pytest.approx(ref.ALL[name](single), rel=1e-10, abs=1e-12), name


def test_json_batch_is_a_list_of_objects_honouring_padding(arrays):
    paths, _, batch = arrays
    proc = _run(str(paths["batch"]), "--format", "json", "--padding-mask", str(paths["pm"]), "--metrics", "mu,avg_abs_cos")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert isinstance(out, list) and len(out) == 3
    for b, row in enumerate(out):
        assert set(row) == {"mu", "avg_abs_cos"}
        assert row["mu"] == pytest.approx(ref.mu(batch[b, :4].astype(float)), rel=1e-10)


@pytest.mark.parametrize("fmt", ["csv", "markdown"])
def test_csv_and_markdown_of_one_matrix_are_one_row_of_numbers(arrays, fmt):
    paths, single, _ = arrays
    proc = _run(str(paths["single"]), "--format", fmt, "--metrics", "mu,avg_abs_cos")
    assert proc.returncode == 0, proc.stderr
    lines = [line.strip("| ") for line in proc.stdout.splitlines() if not line.startswith("| ---")]
    sep = "," if fmt == "csv" else " | "
    assert [line.split(sep) for line in lines][0] == ["mu", "avg_abs_cos"] and len(lines) == 2
    mu, cos = (float(v) for v in lines[1].split(sep))
    assert mu == pytest.approx(ref.mu(single), rel=1e-5)
    assert cos == pytest.approx(ref.ALL["avg_abs_cos"](single), rel=1e-5)


def test_table_output_and_graph_mask(arrays):
    paths, _, _ = arrays
    proc = _run(str(paths["batch"]), "--mask", "causal", "--metrics", "dirichlet_energy,mu")
    assert proc.returncode == 0, proc.stderr
    assert "dirichlet_energy" in proc.stdout and "mean" in proc.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (("missing.npy",), "token array 'missing.npy' does not exist"),
        (("{nan}",), "NaN or Inf"),
        (("{bad_rank}",), "expected shape (N, d) or (B, N, d)"),
        (("{single}", "--metrics", "mu,bogus"), "unknown metric(s) ['bogus']"),
        (("{single}", "--dtype", "int8"), "--dtype must be one of"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(arrays, args, message):
    paths, _, _ = arrays
    proc = _run(*(a.format(**{k: str(v) for k, v in paths.items()}) for a in args))
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


def test_bad_input_through_the_real_process(arrays):
    paths, _, _ = arrays
    proc = _subprocess(str(paths["nan"]))
    assert proc.returncode == 2 and proc.stderr.startswith("rankcollapse: error: NaN or Inf")
    assert "Traceback" not in proc.stderr
