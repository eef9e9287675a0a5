"""Phase grids and cells are checked before anything runs: masks at grid
parse time, schedules refused with what to do, empty grids, cells missing axes, and
cells too large for memory, each a typed error in Python and one line with exit 2."""

import time

import pytest

from rankcollapse.errors import ConfigError, MaskError, MemoryLimitError, RankCollapseError
from rankcollapse.phase import grid
from rankcollapse.phase.grid import DEFAULTS, expand_grid, parse_axis
from rankcollapse.sweep.executors import ExecutionConfig
from tests.cli._harness import run_cli


def assert_cli_refused(args, match, tmp_path):
    out = tmp_path / "out"
    t0 = time.perf_counter()
    res = run_cli("phase", *args, "--out", str(out))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, lines
    assert len(lines) == 1 and lines[0].startswith("rankcollapse: error:") and match in lines[0], lines
    assert time.perf_counter() - t0 < 60
    assert not out.exists()  # refused before the output folder was touched


# --- the mask axis ------------------------------------------------------------------------

@pytest.mark.parametrize("text, match", [
    ("mask=causal,nosuch", "unknown mask 'nosuch'"),
    ("mask=bigbird:w=3;g=1", "no key 'g'"),
    ("mask=sliding_window", "needs key 'w'"),
    ("mask=block:size=x", "must be an integer"),
    ("mask=(causal|complete", "unbalanced"),
    ("mask=file:/nonexistent/m.npy", "not a readable file"),
])
def test_bad_mask_refused_at_parse_time(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_axis(text)


def test_mask_values_kept_with_semicolons():
    assert parse_axis("mask=complete,bigbird:w=3;globals=1;random=0") == (
        "mask", ["complete", "bigbird:w=3,globals=1,random=0"])


@pytest.mark.parametrize("text", ["mask=schedule:causal*5;complete", "mask=causal,schedule:complete"])
def test_schedule_refused_with_what_to_do(text):
    with pytest.raises(ConfigError, match=r"mask schedule.*simulate --mask"):
        parse_axis(text)


def test_mask_checked_at_each_cell_n():
    # valid syntax for any N, but its lengths sum to 8: refused for the cells at N = 16
    with pytest.raises(MaskError, match="sum to 8"):
        expand_grid({"mask": ["documents:lengths=3+5"], "n_tokens": [8, 16]})
    assert len(expand_grid({"mask": ["documents:lengths=3+5"], "n_tokens": [8]})) == 1


def test_cli_unknown_mask_and_schedule_one_line(tmp_path):
    assert_cli_refused(["--axis", "mask=causal,nosuch"], "unknown mask 'nosuch'", tmp_path)
    assert_cli_refused(["--axis", "mask=schedule:causal*5;complete"], "mask schedule", tmp_path)


# --- one temperature per cell --------------------------------------------------------------

@pytest.mark.parametrize("args, match", [
    (["--axis", "beta=log:1", "--axis", "qk_scale=2"], "give one temperature"),
    (["--axis", "qk_scale=log:1"], "--axis qk_scale"),
])
def test_cli_refuses_a_law_in_qk_scale_and_beta_beside_qk_scale(args, match, tmp_path):
    assert_cli_refused([*args, "--depth", "2", "--n-tokens", "4", "--d-model", "2"], match, tmp_path)


# --- empty grids and cells missing axes ---------------------------------------------------

def test_empty_grid_refused():
    with pytest.raises(ConfigError, match="no values"):
        expand_grid({"mask": []})
    from rankcollapse.phase.sweep import run_phase

    with pytest.raises(ConfigError, match="no cells"):
        run_phase([], cache_dir="unused")


@pytest.mark.parametrize("execution, argument", [
    (ExecutionConfig(device="cuda"), "device"), (ExecutionConfig(shard="1/2"), "shard"), ("serial", "execution")])
def test_run_phase_refuses_an_execution_it_cannot_apply(tmp_path, execution, argument):
    from rankcollapse.phase.sweep import run_phase

    cells = expand_grid({}, {"depth": 2, "n_tokens": 4, "d_model": 2})
    with pytest.raises(ConfigError) as exc:
        run_phase(cells, cache_dir=tmp_path / "cache", execution=execution)
    assert exc.value.argument == argument
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("cell, match", [
    ({"mask": "causal"}, "missing axes"),
    ({**DEFAULTS, "bogus": 1}, "unknown axes"),
    ({**DEFAULTS, "n_tokens": 1}, "n_tokens"),
    ({**DEFAULTS, "depth": 2.5}, "depth"),
    ({**DEFAULTS, "norm": "batchnorm"}, "norm"),
    ({**DEFAULTS, "mask": "nosuch"}, "unknown mask"),
    (["not", "a", "dict"], "dict"),
])
def test_bad_cell_is_typed_in_run_cell(cell, match):
    from rankcollapse.phase.cell import run_cell

    with pytest.raises(RankCollapseError, match=match):
        run_cell(cell)


# --- cells sized before they run ----------------------------------------------------------

def test_cell_bytes_closed_form():
    cell = {**DEFAULTS, "n_tokens": 4, "d_model": 3, "depth": 2, "d_qk": 0, "shared": False}
    # weights 2*2*(2*3*3 + 9) = 108, states 3*5*4*3 = 180, attention 2*2*5*16 = 320; 8 bytes each
    assert grid.cell_bytes(cell, 5) == 8 * (108 + 180 + 320)
    assert grid.cell_bytes({**cell, "shared": True}, 5) == 8 * (54 + 180 + 320)


def test_huge_cell_refused_before_running():
    cell = {**DEFAULTS, "n_tokens": 4096, "d_model": 4096, "depth": 1024}
    from rankcollapse.phase.cell import run_cell

    t0 = time.perf_counter()
    with pytest.raises(MemoryLimitError, match="depth = 1024"):
        run_cell(cell)
    assert time.perf_counter() - t0 < 10
    # the default cell is far inside the limit
    grid.check_cells([dict(DEFAULTS)], n_samples=4)


@pytest.mark.parametrize("kw, match", [
    ({"seeds": 0}, "seeds must be an integer >= 1, got 0"), ({"seeds": 1.5}, "seeds must be an integer, got 1.5"),
    ({"n_samples": 0}, "n_samples must be an integer >= 1, got 0"), ({"seed": -1}, "seed must be an integer >= 0"),
    ({"seeds": 10**8}, "with 100000000 seeds x 4 samples needs about"),  # the sweep runs a cell's seeds at once
])
def test_run_phase_refuses_bad_counts_before_any_work(tmp_path, kw, match):
    from rankcollapse.phase import run_phase

    cell = {**DEFAULTS, "n_tokens": 4, "d_model": 2, "depth": 2}
    t0 = time.process_time()
    with pytest.raises(ConfigError, match=match):  # MemoryLimitError is a ConfigError
        run_phase([cell], cache_dir=tmp_path / "cache", **kw)
    assert time.process_time() - t0 < 5 and not (tmp_path / "cache").exists()


def test_cli_huge_cell_one_line(tmp_path):
    assert_cli_refused(["--axis", "n_tokens=4096", "--d-model", "4096", "--depth", "1024"], "TiB of memory", tmp_path)
