"""A ``.npy`` mask file fixes N: ``mask describe/show file:M.npy`` need no ``--n-tokens``,
and ``spec_n_tokens`` reads N from the file's header."""

import numpy as np
import pytest
from typer.testing import CliRunner

from rankcollapse.cli import run
from rankcollapse.errors import MaskError
from rankcollapse.masks import analyze, parse_mask, spec_n_tokens


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save("causal12.npy", np.tril(np.ones((12, 12), dtype=bool)))
    np.save("full8.npy", np.ones((8, 8), dtype=bool))
    np.save("wide.npy", np.ones((3, 4), dtype=bool))
    (tmp_path / "edges.txt").write_text("0 0\n1 0\n1 1\n")
    return tmp_path


def _cli(*argv):
    import sys

    with CliRunner().isolation() as streams:
        code = run(list(argv))
        sys.stdout.flush()
        sys.stderr.flush()
        return code, streams[0].getvalue().decode(), streams[1].getvalue().decode()


def test_spec_n_tokens_reads_npy_files_only(files):
    assert spec_n_tokens("file:causal12.npy") == 12
    assert spec_n_tokens("file:causal12.npy&sliding_window:w=3") == 12
    assert spec_n_tokens("(causal|file:full8.npy)&block:size=4") == 8
    assert spec_n_tokens("causal") is None
    assert spec_n_tokens("file:edges.txt") is None  # an edge list holds for any N >= its largest index
    with pytest.raises(MaskError, match="different sizes"):
        spec_n_tokens("file:causal12.npy&file:full8.npy")
    with pytest.raises(MaskError, match="square"):
        spec_n_tokens("file:wide.npy")
    with pytest.raises(MaskError, match="does not exist"):
        spec_n_tokens("file:absent.npy")


def test_describe_a_npy_mask_without_n_tokens(files):
    import json

    code, out, err = _cli("mask", "describe", "file:causal12.npy", "--format", "json")
    assert code == 0, err
    d = json.loads(out)
    want = analyze(parse_mask("causal", 12)).to_dict()
    assert d["n_tokens"] == 12 and d["radius"] == want["radius"] == 1 and d["n_edges"] == want["n_edges"] == 78


@pytest.mark.parametrize("argv, message", [
    (["mask", "describe", "causal"], "--n-tokens is needed for 'causal'"),
    (["mask", "describe", "file:edges.txt"], "--n-tokens is needed"),
    (["mask", "describe", "file:causal12.npy", "--n-tokens", "5"], "--n-tokens is 5, but mask file 'causal12.npy' has N=12 tokens"),
    (["mask", "show", "file:wide.npy", "--out", "m"], "square"),
])
def test_n_tokens_errors_are_one_line(files, argv, message):
    code, out, err = _cli(*argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], err


def test_show_draws_a_npy_mask_without_n_tokens(files):
    code, _, err = _cli("mask", "show", "file:full8.npy", "--out", "m")
    assert code == 0 and (files / "m" / "mask.png").is_file(), err


def test_simulate_and_phase_take_n_from_a_npy_mask(files):
    """``simulate``/``phase --axis mask=file:M.npy`` without ``--n-tokens`` run at the file's N
    (they refused it with "--n-tokens is 128", a flag not given)."""
    import json

    code, out, err = _cli("simulate", "--mask", "file:causal12.npy|sliding_window:w=3", "--depth", "2",
                          "--n-samples", "2", "--d-model", "4", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["settings"]["n_tokens"] == 12
    code, out, err = _cli("phase", "--axis", "mask=file:causal12.npy,causal", "--depth", "2", "--n-samples", "1",
                          "--d-model", "4", "--out", "ph", "--format", "json")
    assert code == 0, err
    import pandas as pd

    assert sorted(pd.read_parquet(files / "ph" / "phase.parquet")["n_tokens"]) == [12, 12]


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--mask", "file:causal12.npy", "--input", "x8.npy", "--depth", "1"],
     "the N of --input 'x8.npy' is 8, but mask file 'causal12.npy' has N=12 tokens"),
    (["metrics", "x8.npy", "--mask", "file:causal12.npy"],
     "the N of FILE 'x8.npy' is 8, but mask file 'causal12.npy' has N=12 tokens"),
    (["simulate", "--mask", "file:causal12.npy", "--n-tokens", "8", "--depth", "1"],
     "--n-tokens is 8, but mask file 'causal12.npy' has N=12 tokens"),
])
def test_a_mask_file_of_another_n_names_where_n_came_from(files, argv, message):
    np.save("x8.npy", np.random.default_rng(0).standard_normal((2, 8, 4)))
    code, out, err = _cli(*argv)
    assert code == 2 and err.strip().splitlines() == [f"rankcollapse: error: {message}"], err


def test_theory_bound_and_sphere_take_n_from_a_npy_mask(files):
    """``theory bound/sphere --mask file:M.npy`` without ``--n-tokens`` run at the file's N
    (they refused it with "--n-tokens is 32" (16), a flag not given)."""
    import json

    code, out, err = _cli("theory", "bound", "--mask", "file:causal12.npy", "--depth", "3", "--n-samples", "2",
                          "--format", "json")
    assert code == 0, err
    assert json.loads(out)["config"]["n_tokens"] == 12
    code, out, err = _cli("theory", "sphere", "--mask", "file:full8.npy", "--depth", "3", "--format", "json")
    assert code == 0, err
    assert {r["config"]["n_tokens"] for r in json.loads(out)["results"]} == {8}


@pytest.mark.parametrize("argv", [["mask", "describe", "file:empty.npy"], ["mask", "describe", "file:empty.npy", "--n-tokens", "3"],
                                  ["simulate", "--mask", "file:empty.npy|causal"]])
def test_an_empty_npy_mask_is_named_as_empty(files, argv):
    """A (0, 0) matrix: it read as "--n-tokens is 1, but ... has N=0 tokens", a flag not given."""
    np.save("empty.npy", np.ones((0, 0), dtype=bool))
    code, _, err = _cli(*argv)
    assert code == 2 and err.strip().splitlines() == [
        "rankcollapse: error: mask file 'empty.npy' holds an empty (0, 0) matrix; a mask has N >= 1 tokens"], err
    with pytest.raises(MaskError, match=r"^mask file 'empty.npy' holds an empty \(0, 0\) matrix"):
        spec_n_tokens("file:empty.npy")


def test_compare_takes_n_from_the_npy_mask_files_among_its_specs(files):
    """``mask compare`` reads N as ``describe`` does: from a ``.npy`` file among the specs (the
    other specs on that N), refusing files of different N, and without one asks for --n-tokens."""
    import json

    code, out, err = _cli("mask", "compare", "file:causal12.npy", "sliding_window:w=3", "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    code, want, err = _cli("mask", "compare", "causal", "sliding_window:w=3", "--n-tokens", "12", "--format", "json")
    assert code == 0, err
    assert [r["radius"] for r in rows] == [r["radius"] for r in json.loads(want)] == [1, 6]
    for argv, message in ((["file:causal12.npy", "file:full8.npy"], "mask files of different sizes: "
                           "file:causal12.npy (N=12), file:full8.npy (N=8)"),
                          (["causal", "complete"], "--n-tokens is needed for 'causal', 'complete'")):
        code, _, err = _cli("mask", "compare", *argv)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
