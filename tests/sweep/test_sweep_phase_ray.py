"""A phase grid under Ray: the Ray task runs the ``phase_cell`` kind's own function
(it once looked every unit up in the experiments' table and failed with KeyError)."""

import pandas as pd
import pytest

pytestmark = pytest.mark.slow


def test_phase_grid_under_ray_gives_the_serial_numbers(monkeypatch, tmp_path):
    pytest.importorskip("ray")
    from rankcollapse.phase.grid import expand_grid, parse_axis
    from rankcollapse.phase.sweep import run_phase
    from rankcollapse.sweep.executors import ExecutionConfig

    # a private 1-CPU Ray instance on this machine, without token authentication
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    cells = expand_grid(dict([parse_axis("qk_scale=0.5,2")]), {"depth": 4, "n_tokens": 6, "d_model": 3}, ())
    serial, _ = run_phase(cells, n_samples=2, cache_dir=tmp_path / "a")
    ray, timing = run_phase(cells, n_samples=2, cache_dir=tmp_path / "b",
                            execution=ExecutionConfig(executor="ray", workers=1))
    pd.testing.assert_frame_equal(ray, serial)
    assert timing["computed"] == 1 and timing["executor"] == "ray" and timing["workers"] == 1
