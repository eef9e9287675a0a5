"""The phase grid, sweep cache, report files and the `rankcollapse phase` command (in-process,
and once through the real entry point in a fresh interpreter)."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.phase.grid import DEFAULTS, expand_grid, parse_axis
from rankcollapse.phase.regime import REGIMES
from rankcollapse.phase.report import theory_agreement, write_report
from rankcollapse.phase.sweep import batches, run_phase
from rankcollapse.sweep.executors import ExecutionConfig
from tests.cli._harness import run_cli

CLI = [sys.executable, "-c", "from rankcollapse.cli import main; main()"]


def test_parse_axis_values_and_errors():
    assert parse_axis("qk_scale=0.25,1,4") == ("qk_scale", [0.25, 1.0, 4.0])
    assert parse_axis("alpha=0,1") == ("alpha", [0.0, 1.0])
    assert parse_axis("placement=none,post_ln,pre_ln") == ("placement", ["none", "post_ln", "pre_ln"])
    assert parse_axis("mask=complete,bigbird:w=3;globals=1;random=0") == ("mask", ["complete", "bigbird:w=3,globals=1,random=0"])
    for bad in ("nosuch=1", "qk_scale", "qk_scale=", "qk_scale=-1", "norm=batchnorm", "depth=2000", "d_qk=x"):
        with pytest.raises(ConfigError):
            parse_axis(bad)


def test_a_value_given_twice_is_refused_but_zipped_axes_may_repeat():
    with pytest.raises(ConfigError, match=r"axis qk_scale=1.0 given twice: each cell once"):
        expand_grid({"qk_scale": [1.0, 0.5, 1.0]})
    with pytest.raises(ConfigError, match=r"zipped axes qk_scale=1.0, norm='none' given twice"):
        expand_grid({"qk_scale": [1.0, 2.0, 1.0], "norm": ["none", "none", "none"]}, zipped=("qk_scale", "norm"))
    cells = expand_grid({"qk_scale": [1.0, 2.0, 1.0], "norm": ["none", "none", "sphere"]}, zipped=("qk_scale", "norm"))
    assert [(c["qk_scale"], c["norm"]) for c in cells] == [(1.0, "none"), (2.0, "none"), (1.0, "sphere")]


def test_expand_grid_is_the_product_over_defaults():
    cells = expand_grid({"qk_scale": [0.5, 2.0], "norm": ["none", "sphere", "layernorm"]}, {"depth": 8})
    assert len(cells) == 6
    assert [c["norm"] for c in cells[:3]] == ["none", "sphere", "layernorm"]  # last axis fastest
    assert all(c["depth"] == 8 and c["mask"] == DEFAULTS["mask"] for c in cells)
    with pytest.raises(ConfigError):
        expand_grid({"bogus": [1]})


def test_batches_group_by_shared_keys_and_cut():
    cells = expand_grid({"qk_scale": [0.5, 1.0, 2.0], "norm": ["none", "sphere"]})
    parts = batches(cells, 2)
    assert sorted(i for p in parts for i in p) == list(range(6))
    for p in parts:
        assert len(p) <= 2 and len({cells[i]["norm"] for i in p}) == 1


def test_run_phase_caches_units_and_keeps_cell_order(tmp_path):
    cells = expand_grid({"qk_scale": [0.0, 1.0], "norm": ["none", "layernorm"]}, {"depth": 8, "n_tokens": 8, "d_model": 4})
    t1, timing1 = run_phase(cells, n_samples=2, cache_dir=tmp_path)
    t2, timing2 = run_phase(cells, n_samples=2, cache_dir=tmp_path)
    assert timing1["computed"] == 2 and timing2["computed"] == 0 and timing2["cached"] == 2
    assert list(t1["qk_scale"]) == [0.0, 0.0, 1.0, 1.0] and list(t1["norm"]) == ["none", "layernorm"] * 2
    pd.testing.assert_frame_equal(t1, t2)


def test_write_report_files_and_theory_agreement(tmp_path):
    cells = expand_grid({"qk_scale": [0.0, 1.0], "norm": ["none", "sphere"], "mask": ["complete", "causal"]},
                        {"depth": 8, "n_tokens": 8, "d_model": 4, "value": "orthogonal"})
    table, timing = run_phase(cells, n_samples=2, cache_dir=tmp_path / "c")
    paths = write_report(table, ["qk_scale", "norm", "mask"], tmp_path, meta={"timing": timing})
    assert pd.read_parquet(paths["parquet"]).shape[0] == 8
    assert paths["heatmaps"] == [str(tmp_path / "heatmap.png")]
    assert "8 cells" in (tmp_path / "report.html").read_text()
    agree = theory_agreement(table)
    pred = table[table["theory_regime"] != ""]
    assert agree["n"] == len(pred) == 4  # norm none, no skip, ||W_V||_2 = 1: Theorem 1
    assert sum(agree["counts"].values()) == 4 and agree["agree"] == agree["counts"]["agree"] / 4  # verdicts: test_phase_theory_verdict


def test_cli_json_and_files(tmp_path):
    out = subprocess.run([*CLI, "phase", "--axis", "qk_scale=0.25,4", "--axis", "norm=none,layernorm",
                          "--depth", "8", "--n-tokens", "8", "--d-model", "4", "--n-samples", "2",
                          "--out", str(tmp_path), "--format", "json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert len(data["cells"]) == 4
    keys = {"qk_scale", "norm", "mu_relative", "numerical_rank", "attention_entropy", "rate", "regime"}
    assert keys <= set(data["cells"][0])
    assert all(c["regime"] in set(REGIMES) for c in data["cells"])
    assert all(sum(c[f"frac_{r}"] for r in REGIMES) == pytest.approx(1.0) for c in data["cells"])
    for name in ("phase.parquet", "heatmap.png", "report.html"):
        assert (tmp_path / name).is_file()


@pytest.mark.parametrize("args, fragment", [
    (("--axis", "nosuch=1"), "--axis expects NAME="),
    (("--axis", "norm=batchnorm"), "--axis norm"),
    (("--n-samples", "0"), "--n-samples must be >= 1"),
])
def test_cli_errors_are_one_line(tmp_path, args, fragment):
    out = run_cli("phase", *args, "--out", str(tmp_path))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0]


@pytest.mark.slow
def test_processes_executor_gives_the_serial_numbers(tmp_path):
    cells = expand_grid({"qk_scale": [0.5, 2.0], "norm": ["none", "sphere"]}, {"depth": 8, "n_tokens": 8, "d_model": 4})
    serial, _ = run_phase(cells, n_samples=2, cache_dir=tmp_path / "a")
    procs, timing = run_phase(cells, n_samples=2, cache_dir=tmp_path / "b",
                              execution=ExecutionConfig(executor="processes", workers=2))
    assert timing["computed"] == 2
    pd.testing.assert_frame_equal(serial, procs)


def test_heatmap_legend_says_what_colours_and_numbers_mean(tmp_path, monkeypatch):
    """The colour is the regime (one patch per regime) and the number log10(μ/‖X‖_F):
    both are named in the legend."""
    from rankcollapse import _figure
    from rankcollapse.phase.report import heatmaps
    from rankcollapse.phase.regime import REGIMES

    figs = []
    monkeypatch.setattr(_figure, "save_figure", lambda fig, path, **kw: figs.append(fig))
    table = pd.DataFrame({"qk_scale": [0.25, 8.0], "norm": ["none", "none"], "regime": ["rank_collapse", "undecided"],
                          "mu_relative": [1e-300, 0.08]})
    heatmaps(table, ["qk_scale", "norm"], tmp_path)
    (legend,) = figs[0].legends
    assert [t.get_text() for t in legend.get_texts()] == list(REGIMES)
    assert "log10(μ/‖X‖_F) at the last layer" in legend.get_title().get_text()
    texts = sorted(t.get_text() for t in figs[0].axes[0].texts)
    assert texts == ["-1", "-300"]


def test_heatmap_numbers_have_no_negative_zero(tmp_path, monkeypatch):
    """log10 of 0.78 rounds to 0: the cell reads 0 (aligned, not collapsed), not -0."""
    from rankcollapse import _figure
    from rankcollapse.phase.report import heatmaps

    figs = []
    monkeypatch.setattr(_figure, "save_figure", lambda fig, path, **kw: figs.append(fig))
    table = pd.DataFrame({"qk_scale": [0.25, 1.0, 8.0], "norm": "none", "regime": "undecided",
                          "mu_relative": [0.78, 0.4, 1.0]})
    heatmaps(table, ["qk_scale", "norm"], tmp_path)
    assert sorted(t.get_text() for t in figs[0].axes[0].texts) == ["0", "0", "0"]


def test_fixed_point_text_has_no_negative_zero():
    from rankcollapse._display import fixed

    assert [fixed(-0.108), fixed(-0.6), fixed(-1e-9, "+.5f"), fixed(-0.0, ".3f"), fixed(-2e-3, ".4f")] == \
        ["0", "-1", "+0.00000", "0.000", "-0.0020"]
    from rankcollapse.experiments.claims import fmt

    assert fmt(-0.0) == "0" and fmt(-1e-5) == "-1e-05"


def test_readme_phase_example_has_cells_in_several_regimes(tmp_path):
    """The README's phase command, run as written (output folder aside), labels its cells
    with more than one regime, and its counts are those the README states."""
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (line,) = [ln for ln in readme.splitlines() if ln.startswith("rankcollapse phase ")]
    argv = shlex.split(line)[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "phase")
    res = run_cli(*argv)
    assert res.returncode == 0, res.stderr
    cells = json.loads(res.stdout)["cells"]
    assert len({c["regime"] for c in cells}) >= 2, [c["regime"] for c in cells]
    regimes = {(c["qk_scale"], c["norm"], c["placement"]): c["regime"] for c in cells}
    no_skip = [r for (_, _, placement), r in regimes.items() if placement == "none"]
    with_skip = [r for (_, _, placement), r in regimes.items() if placement == "post_ln"]
    assert no_skip.count("rank_collapse") == 3 and "rank_collapse" not in with_skip
    assert set(with_skip) == {"collapsing_slowly"}
    assert re.search(r"every cell but one collapses", readme)
    # the exception: LayerNorm at q/k scale 8, one trajectory collapsed and one aligned
    (odd,) = [c for c in cells if c["placement"] == "none" and c["regime"] != "rank_collapse"]
    assert (odd["qk_scale"], odd["norm"], odd["regime"]) == (8.0, "layernorm", "undecided")
    assert odd["frac_rank_collapse"] == odd["frac_aligned_without_consensus"] == 0.5
    assert f"μ/‖X‖_F {odd['mu_relative']:.2f}" in " ".join(readme.split())


def test_axes_are_block_config_fields():
    """norm, placement, alpha are BlockConfig's fields (cell.block_config); an axis
    spelling that is not one of them is refused."""
    from rankcollapse.dynamics import BlockConfig
    from rankcollapse.phase.cell import block_config

    for bad in ("skip=off,on", "norm=sphere_sqrtd", "placement=post,pre"):
        with pytest.raises(ConfigError):
            parse_axis(bad)
    cells = expand_grid({"placement": ["post_ln", "pre_ln"], "alpha": [0.0, 1.0]})
    assert [(c["placement"], c["alpha"]) for c in cells] == [("none", 0.0), ("post_ln", 1.0), ("pre_ln", 0.0),
                                                            ("pre_ln", 1.0)]
    assert [block_config(c) for c in cells] == [
        BlockConfig(), BlockConfig(placement="post_ln", alpha=1.0), BlockConfig(placement="pre_ln", alpha=0.0),
        BlockConfig(placement="pre_ln", alpha=1.0)]
    new = expand_grid({"placement": ["none", "post_ln", "pre_ln"]})  # alpha: the placement's own
    assert [(c["placement"], c["alpha"]) for c in new] == [("none", 0.0), ("post_ln", 1.0), ("pre_ln", 1.0)]
    with pytest.raises(ConfigError, match="placement 'none' has no skip"):
        expand_grid({"placement": ["none", "post_ln"], "alpha": [0.0, 1.0]})
    assert len(expand_grid({"placement": ["none", "post_ln"], "alpha": [0.0, 1.0]}, zipped=("placement", "alpha"))) == 2
    with pytest.raises(ConfigError, match="unknown axes"):
        expand_grid({"alpha": [0.0]}, {"skip": True})


def test_zipped_axes_vary_together_and_cross_the_rest():
    cells = expand_grid({"qk_scale": [0.5, 2.0, 8.0], "norm": ["none", "sphere"], "value": ["gaussian", "orthogonal", "gaussian"]},
                        zipped=("qk_scale", "value"))
    assert len(cells) == 6  # 3 zipped tuples x 2 norms
    assert [(c["qk_scale"], c["value"], c["norm"]) for c in cells] == [
        (0.5, "gaussian", "none"), (0.5, "gaussian", "sphere"), (2.0, "orthogonal", "none"),
        (2.0, "orthogonal", "sphere"), (8.0, "gaussian", "none"), (8.0, "gaussian", "sphere")]
    for bad in (("qk_scale",), ("qk_scale", "depth"), ("qk_scale", "norm")):
        with pytest.raises(ConfigError):
            expand_grid({"qk_scale": [0.5, 2.0, 8.0], "norm": ["none", "sphere"]}, zipped=bad)


def test_a_smaller_grid_after_a_bigger_one_leaves_none_of_its_outputs(tmp_path):
    """Same --out: the second run's outputs replace the first's whole (the extra heatmap
    files of the bigger grid go); the user's own files and the cache stay; a foreign
    non-empty folder is refused unless allowed."""
    from rankcollapse._outdir import MANIFEST

    out = tmp_path / "phase"
    base = ["phase", "--depth", "4", "--n-tokens", "4", "--d-model", "2", "--n-samples", "1", "--out", str(out),
            "--format", "json"]
    big = run_cli(*base, "--axis", "qk_scale=0.5,8", "--axis", "norm=none,sphere", "--axis", "placement=none,post_ln",
                  "--axis", "d_qk=1,2,4,8", "--axis", "value_scale=0.5,1,2,4", "--plot", "qk_scale,norm")
    assert big.returncode == 0, big.stderr
    first = set(json.loads((out / MANIFEST).read_text()))
    assert {"heatmap_000.png", "heatmap_001.png"} <= first
    (out / "mine.txt").write_text("user file")
    small = run_cli(*base, "--axis", "qk_scale=0.5,8")
    assert small.returncode == 0, small.stderr
    names = {p.name for p in out.iterdir()}
    assert "heatmap.png" in names and not {"heatmap_000.png", "heatmap_001.png"} & names
    assert {"mine.txt", "cache", "COMPLETE", "phase.parquet", "report.html"} <= names
    assert json.loads(small.stdout)["files"]["report"] == str(out / "report.html")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.csv").write_text("x")
    res = run_cli(*base[:-4], "--out", str(foreign))
    assert res.returncode == 2 and "--allow-nonempty" in res.stderr and res.stderr.count("\n") == 1
    assert sorted(p.name for p in foreign.iterdir()) == ["data.csv"]


def test_long_qk_norm_cell_is_refused_before_out_is_touched(tmp_path):
    out = tmp_path / "D"
    res = run_cli("phase", "--axis", "beta=log:1.5", "--axis", "input=simplex", "--axis", "norm=sphere",
                  "--axis", "value=orthogonal", "--axis", "n_tokens=5000", "--axis", "qk_norm=on", "--depth", "1",
                  "--d-model", "8", "--n-samples", "1", "--out", str(out))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "qk_norm=on" in res.stderr and "above 4096 tokens" in res.stderr
    assert not out.exists()  # no lock file, no folder
