"""`rankcollapse theory ...` through the CLI: in-process, and once through the real entry
point in a fresh interpreter."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.cli._harness import run_cli

CLI = [sys.executable, "-c", "from rankcollapse.cli import main; main()"]


def run(*args):
    return run_cli("theory", *args)


@pytest.mark.parametrize("n,d,k", [(2, 2, 2), (6, 4, 3)])
def test_equilibria_json_is_verifiable_from_printed_system(n, d, k, numpy_step):
    p = run("equilibria", "--n-tokens", str(n), "--d-model", str(d), "--rank", str(k), "--format", "json")
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    assert {"mask", "W_Q", "W_K", "W_V", "d_qk", "equilibria"} <= set(obj)
    assert np.array(obj["mask"]).shape == (n, n)
    eqs = [e for e in obj["equilibria"] if e["rank"] == k]
    assert len(eqs) >= 2**k and all(isinstance(e["stable"], bool) for e in eqs)
    for e in eqs:
        X = np.array(e["X"])
        assert X.shape == (n, d) and np.linalg.matrix_rank(X, tol=1e-8) == k
        np.testing.assert_allclose(numpy_step(obj, X), X, atol=1e-10, rtol=0)


def test_bad_rank_exits_2_with_message():
    p = subprocess.run([*CLI, "theory", "equilibria", "--n-tokens", "2", "--d-model", "3", "--rank", "3"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "rank must satisfy" in p.stderr and p.stdout == ""


def test_basin_and_find_json(tmp_path):
    p = run("basin", "--n-samples", "400", "--depth", "100", "--format", "json")
    assert p.returncode == 0, p.stderr
    b = json.loads(p.stdout)
    assert b["n_samples"] == 400 and b["seed"] == 0 and 0 < b["fraction"] < 0.2 and b["ci_low"] < b["ci_high"]
    system = json.loads(run("equilibria", "--example", "--format", "json").stdout)
    path = tmp_path / "system.json"
    path.write_text(json.dumps(system))
    f = json.loads(run("find", "--system", str(path), "--starts", "32", "--format", "json").stdout)
    assert any(e["rank"] == 2 and e["stable"] for e in f["equilibria"])
    bad = run("find", "--system", str(tmp_path / "missing.json"))
    assert bad.returncode == 2 and "cannot read system JSON" in bad.stderr


@pytest.mark.parametrize(
    "args, text",
    [
        (["bound", "--n-tokens", "1", "--widths", "2"], "at least 2 tokens"),
        (["basin", "--confidence", "1.5", "--n-samples", "10"], "confidence"),
    ],
)
def test_bad_theory_options_one_line_exit_2(monkeypatch, capsys, args, text):
    from rankcollapse.cli import main

    monkeypatch.setattr(sys, "argv", ["rankcollapse", "theory", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and text in err, err
