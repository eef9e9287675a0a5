"""Property tests of the CLI contract over generated argument vectors.

Every command, given valid and invalid numbers (huge, negative, zero, NaN, inf,
unicode digits), mask specs and paths (missing, empty, a folder, a file where a
folder is expected, read-only), must exit 0 or 2, print no traceback (one line on
error), print strict JSON and no non-finite number, and leave nothing behind after a
failure. Runs in-process with a fixed example budget per command.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ._harness import check_run, make_inputs

BUDGET = settings(max_examples=25, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

SMALL = ["1", "2", "3", "4", "6"]
BAD = ["0", "-1", "99999999999999999999", "-99999999999999999999", "nan", "inf", "-inf", "1e400",
       "\u0663", "\u00b2", "1.5", "abc", ""]
INTS = st.sampled_from(SMALL + BAD)
FLOATS = st.sampled_from(["1", "0.5", "2.0", "1e-3"] + BAD)
GOOD_SPECS = ["causal", "complete", "sliding_window:w=3", "causal_sliding_window:w=2", "causal&sliding_window:w=3",
              "causal|complete"]
SPECS = st.sampled_from(GOOD_SPECS + [
    "sliding_window:w=99999999999999999999", "causal_sliding_window:w=0",
    "sliding_window:w=\u00b2", "bogus", "", "file:edges.txt", "file:edges_dashes.txt", "file:edges_super.txt",
    "file:empty.npy", "file:missing.npy", "file:mask6.npy", "file:strings.npy", "file:archive.npz", "file:adir",
])
ARRAYS = st.sampled_from([
    "good.npy", "batch.npy", "huge.npy", "antipodal.npy", "zeros.npy", "nan.npy", "empty.npy", "strings.npy",
    "dates.npy", "records.npy", "bigendian.npy", "archive.npz", "missing.npy", "adir", "afile",
])
VALID = {INTS: st.sampled_from(SMALL), FLOATS: st.sampled_from(["1", "0.5", "2.0"]),
         SPECS: st.sampled_from(GOOD_SPECS)}
OUT_FILES = st.sampled_from(["out.png", "m.xyz", "afile/m.png", "adir", "ro/m.png", "new/sub/m.svg", "afile"])
OUT_DIRS = st.sampled_from(["outdir", "afile", "afile/sub", "ro/x", "adir", "new/deep/dir"])
SYSTEMS = st.sampled_from(["system.json", "system_abc.json", "system_null.json", "system_nan.json",
                           "notjson.json", "missing.json", "adir", "empty.npy"])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("inputs"))


def _valid(draw) -> bool:
    """About half the vectors use valid numbers and specs only (the other half mix in
    invalid ones), so that both the success and the failure paths are exercised."""
    return draw(st.booleans())


def _pick(draw, strategy, valid):
    return draw(VALID[strategy] if valid else strategy)


def _opt(draw, flag, strategy, ok=False):
    return [flag, _pick(draw, strategy, ok) if strategy in VALID else draw(strategy)] if draw(st.booleans()) else []


@st.composite
def mask_describe(draw):
    ok = _valid(draw)
    return ["mask", "describe", _pick(draw, SPECS, ok), "--n-tokens", _pick(draw, INTS, ok), *draw(st.sampled_from([["--format", "json"], []])),
            *_opt(draw, "--max-memory", st.sampled_from(["1kB", "8GiB", "abc", "-1", "nan"]))]


@st.composite
def mask_compare(draw):
    ok = _valid(draw)
    return ["mask", "compare", _pick(draw, SPECS, ok), _pick(draw, SPECS, ok), "--n-tokens", _pick(draw, INTS, ok), "--format", "json",
            *_opt(draw, "--d-qk", FLOATS, ok), *_opt(draw, "--token-norm", FLOATS, ok), *_opt(draw, "--weight-norm", FLOATS, ok),
            *_opt(draw, "--out", st.sampled_from(["t.csv", "afile/t.csv", "adir", "ro/t.csv"]))]


@st.composite
def mask_show(draw):
    ok = _valid(draw)
    return ["mask", "show", _pick(draw, SPECS, ok), "--n-tokens", _pick(draw, INTS, ok), "--out", draw(OUT_FILES)]


@st.composite
def metrics_cmd(draw):
    ok = _valid(draw)
    return ["metrics", draw(ARRAYS), *draw(st.sampled_from([["--format", "json"], []])),
            *_opt(draw, "--metrics", st.sampled_from(["mu,avg_cos", "cos_to_mean", "bogus", ",", "all"])),
            *_opt(draw, "--padding-mask", st.sampled_from(["pad.npy", "empty.npy", "strings.npy", "missing.npy"])),
            *_opt(draw, "--mask", st.sampled_from(["causal", "bogus", "file:empty.npy"])),
            *_opt(draw, "--dtype", st.sampled_from(["float32", "float64", "int8"]))]


@st.composite
def simulate_cmd(draw):
    ok = _valid(draw)
    argv = ["simulate", "--n-tokens", _pick(draw, INTS, ok), "--depth", _pick(draw, INTS, ok), "--n-samples", _pick(draw, INTS, ok),
            "--d-model", _pick(draw, INTS, ok), "--mask", _pick(draw, SPECS, ok), "--format", "json"]
    argv += _opt(draw, "--d-qk", FLOATS, ok) + _opt(draw, "--seed", INTS, ok)
    argv += _opt(draw, "--input", st.sampled_from(["sphere", "good.npy", "empty.npy", "nan.npy", "archive.npz",
                                                     "strings.npy", "missing.npy"]))
    argv += _opt(draw, "--out", OUT_DIRS)
    if draw(st.integers(0, 9)) == 9:  # an option that takes one value, given twice
        argv += ["--mask", "causal"]
    return argv


@st.composite
def theory_cmd(draw):
    ok = _valid(draw)
    which = draw(st.sampled_from(["equilibria", "find", "sphere", "bound", "basin"]))
    if which == "equilibria":
        return ["theory", "equilibria", "--n-tokens", _pick(draw, INTS, ok), "--d-model", _pick(draw, INTS, ok), "--rank", _pick(draw, INTS, ok),
                *_opt(draw, "--limit", INTS, ok), "--format", "json"]
    if which == "find":
        return ["theory", "find", "--system", draw(SYSTEMS), "--starts", _pick(draw, INTS, ok), "--format", "json"]
    if which == "basin":
        return ["theory", "basin", "--system", draw(SYSTEMS), "--n-samples", _pick(draw, INTS, ok), "--depth", _pick(draw, INTS, ok),
                "--confidence", _pick(draw, FLOATS, ok), "--format", "json"]
    if which == "sphere":
        return ["theory", "sphere", "--n-tokens", _pick(draw, INTS, ok), "--d-model", _pick(draw, INTS, ok), "--depth", _pick(draw, INTS, ok),
                "--beta", _pick(draw, FLOATS, ok), "--mask", _pick(draw, SPECS, ok), "--format", "json"]
    return ["theory", "bound", "--mask", _pick(draw, SPECS, ok), "--n-tokens", _pick(draw, INTS, ok), "--d-model", _pick(draw, INTS, ok), "--depth", _pick(draw, INTS, ok),
            "--n-samples", _pick(draw, INTS, ok), "--format", "json"]


@st.composite
def probe_invalid(draw):
    """Probe arguments that must be refused before a model is loaded or anything written."""
    ok = _valid(draw)
    bad = draw(st.sampled_from([["--n-samples", "0"], ["--n-tokens", "1"], ["--batch-size", "-1"],
                                ["--d-qk", "nan"], ["--n-tokens", "99999999999999999999"],
                                ["--mask", "bogus"], ["--corpus", "nowhere"], ["--n-samples", "inf"]]))
    return ["probe", "--model", "minilm", *bad, *_opt(draw, "--out", OUT_DIRS), "--format", "json"]


@st.composite
def reproduce_invalid(draw):
    """Reproduce arguments that must be refused before any output folder or cache entry."""
    bad = draw(st.sampled_from([
        ["--seed", draw(st.sampled_from(["-1", "99999999999999999999", "nan", "\u00b2", "1.5"]))],
        ["--device", draw(st.sampled_from(["bogus", "cuda:97", "", "cpu:x"]))],
        ["--cache-dir", draw(st.sampled_from(["afile", "afile/sub"]))],
        ["--n-tokens", draw(st.sampled_from(["0", "1", "-5", "nan", "99999999999999999999"]))],
        ["--scale", "bogus"], ["--executor", "bogus"], ["--depth", "0"], ["--n-samples", "-1"],
        ["--mask", "file:empty.npy"], ["--text-file", "missing.txt"],
    ]))
    out = draw(st.sampled_from(["run", "afile", "afile/sub", "new/run"]))
    return ["reproduce", "main", "--scale", "smoke", "--no-progress", *bad, "--out", out, "--format", "json"]


COMMANDS = {
    "mask describe": mask_describe(), "mask compare": mask_compare(), "mask show": mask_show(),
    "metrics": metrics_cmd(), "simulate": simulate_cmd(), "theory": theory_cmd(), "probe": probe_invalid(),
    "reproduce": reproduce_invalid(),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_argument_vector_keeps_the_contract(root, command):
    @BUDGET
    @given(COMMANDS[command])
    def check(argv):
        check_run(argv, root)

    check()


@pytest.mark.parametrize("argv, message", [
    (["mask", "describe", "causal", "--n-tokens", "99999999999999999999"], "64-bit"),
    (["mask", "describe", "sliding_window:w=99999999999999999999", "--n-tokens", "16"], "64-bit"),
    (["mask", "show", "causal", "--n-tokens", "8", "--out", "m", "--image-format", "xyz"],
     "--image-format must be one of png, pdf, svg, got 'xyz'"),
    (["mask", "show", "causal", "--n-tokens", "8", "--out", "m", "--image-format", "gif"],  # matplotlib writes gif
     "--image-format must be one of png, pdf, svg, got 'gif'"),
    (["mask", "show", "causal", "--n-tokens", "8", "--out", "afile/m.png"], "is a file where a folder is needed"),
    (["mask", "describe", "file:edges_dashes.txt", "--n-tokens", "4"], "expected two integers"),
    (["mask", "describe", "file:edges_super.txt", "--n-tokens", "4"], "expected two integers"),
    (["metrics", "empty.npy"], "is empty (0 bytes)"),
    (["metrics", "good.npy", "--padding-mask", "empty.npy"], "is empty (0 bytes)"),
    (["mask", "describe", "file:empty.npy", "--n-tokens", "4"], "is empty (0 bytes)"),
    (["metrics", "strings.npy"], "expected bool, integer or float"),
    (["metrics", "dates.npy"], "expected bool, integer or float"),
    (["metrics", "records.npy"], "expected bool, integer or float"),
    (["metrics", "archive.npz"], ".npz archive"),
    (["theory", "find", "--system", "system_abc.json"], "d_qk must be a number"),
    (["theory", "find", "--system", "system_null.json"], "d_qk must be a number"),
    (["theory", "equilibria", "--n-tokens", "2", "--d-model", "2", "--rank", "2", "--limit", "-1"], "limit must be an integer >= 1"),
    (["theory", "equilibria", "--n-tokens", "2", "--d-model", "2", "--rank", "2", "--limit", "0"], "limit must be an integer >= 1"),
    (["mask", "compare", "causal", "--n-tokens", "8", "--d-qk", "nan", "--format", "json"], "--d-qk must be a finite number"),
    (["simulate", "--mask", "complete", "--mask", "causal"], "--mask given more than once"),
    (["simulate", "--n-tokens", "100000", "--mask", "complete", "--n-samples", "1", "--d-model", "4"], "--max-memory"),
    (["simulate", "--out", "afile", "--depth", "1"], "is an existing file"),
    (["reproduce", "--scale", "smoke", "--device", "bogus", "--out", "r"], "not a torch device"),
    (["reproduce", "--scale", "smoke", "--device", "cuda:97", "--out", "r"], "not available"),
    (["reproduce", "--scale", "smoke", "--seed", "-1", "--out", "r"], "--seed must be an integer >= 0"),
    (["reproduce", "--scale", "smoke", "--cache-dir", "afile", "--out", "r"], "--cache-dir 'afile' is an existing file"),
    pytest.param(["reproduce", "--scale", "smoke", "--n-tokens", "1024", "--out", "r", "--no-progress"], "512 positions",
                 marks=pytest.mark.slow),  # loads MiniLM (~13 s)
])
def test_issue_inputs_end_in_one_line(root, argv, message):
    code, out, err = check_run(argv, root)
    assert code == 2 and message in err, err


def test_big_endian_array_is_converted(root):
    code, out, _ = check_run(["metrics", "bigendian.npy", "--format", "json", "--metrics", "mu"], root)
    assert code == 0 and '"mu"' in out


def test_undefined_metric_is_null_with_reason(root):
    import json

    code, out, _ = check_run(["metrics", "antipodal.npy", "--format", "json"], root)
    row = json.loads(out)
    assert code == 0 and row["cos_to_mean"] is None and "mean token is zero" in row["undefined"]["cos_to_mean"]
    assert row["avg_abs_cos"] == pytest.approx(1.0)


def test_huge_complete_mask_is_described_without_a_csr(root):
    import json

    code, out, _ = check_run(["mask", "describe", "complete", "--n-tokens", "65536", "--format", "json"], root)
    d = json.loads(out)
    assert code == 0 and d["method"] == "intervals" and d["radius"] == 1 and d["n_edges"] == 65536**2


def test_pickles_are_refused_without_suggesting_unsafe_loading(root):
    import numpy as np

    np.save(root / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    try:
        code, _, err = check_run(["metrics", "objects.npy"], root)
    finally:
        (root / "objects.npy").unlink()
    assert code == 2 and "refused" in err
    assert "allow_pickle" not in err and "unsafely" not in err
