"""The schedule study: budget matching and a smoke run writing its table and figure."""

import pandas as pd
import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.experiments.schedules import load_study, run_schedule_study, window_for_budget


def test_window_for_budget_matches_edges():
    # causal_sliding_window:w on N=64 has w N - w(w-1)/2 pairs; 1:1 with causal adds 2080
    w, spec, e = window_for_budget("causal_sliding_window:w={w},causal", 64, 1260.0)
    assert w == 7 and spec == "schedule:causal_sliding_window:w=7,causal"
    assert e == (7 * 64 - 21 + 64 * 65 / 2) / 2


def test_unknown_scale():
    with pytest.raises(ConfigError, match="scale"):
        load_study("huge")


@pytest.mark.parametrize("where, key, value, message", [
    (("simulation",), "dpeth", 60, "config schedules: simulation: unknown key 'dpeth'"),
    (("scales", "smoke"), "n_sample", 2, "config schedules: scales.smoke: unknown key 'n_sample'"),
    ((), "budget_tolerence", 0.03, "config schedules: unknown key 'budget_tolerence'"),
    (("simulation",), "depth", 0, "config schedules: simulation: depth: Input should be greater than or equal to 1"),
])
def test_a_bad_key_in_the_study_file_is_refused_naming_it(monkeypatch, where, key, value, message):
    import copy

    from rankcollapse.experiments import schedules

    good = schedules._read_study()
    for scale in ("smoke", "quick", "paper"):
        load_study(scale)  # the shipped file passes the schema
    bad = copy.deepcopy(good)
    node = bad
    for k in where:
        node = node[k]
    node[key] = value
    monkeypatch.setattr(schedules, "_read_study", lambda: bad)
    with pytest.raises(ConfigError) as err:
        load_study("smoke")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_smoke_run_writes_table_and_figure(tmp_path):
    table = run_schedule_study(tmp_path, "smoke")
    assert (tmp_path / "schedules.png").stat().st_size > 0
    back = pd.read_csv(tmp_path / "schedules.csv")
    assert len(back) == len(table) == 4  # four families all meet the w'=24 budget within 3 %
    assert ((back["mean_edges_per_layer"] - back["budget"]).abs() <= 0.03 * back["budget"]).all()
    assert back["measured_rate"].between(0, 1).all() and set(back["rank_measured"]) <= {1, 2, 3, 4}


def test_simulate_unit_takes_a_schedule_mask():
    from types import SimpleNamespace

    import torch

    from rankcollapse.dynamics import RunConfig, gaussian_tokens, simulate
    from rankcollapse.sweep.units import Unit
    from rankcollapse.experiments.units import _simulate_chunks

    spec = "schedule:causal_sliding_window:w=2*2,causal"
    unit = Unit("simulate", {"mask": spec, "seed": 0, "dtype": "float64", "metrics": ["mu"]}, "schedules")
    X0 = gaussian_tokens(3, 10, 4, seed=1).double()
    got = _simulate_chunks(unit, SimpleNamespace(device="cpu"), lambda a, b: X0[a:b], 3, 4, lambda d: {})
    want = simulate(X0, mask=spec, metrics=["mu"], run=RunConfig(depth=4, seed=0, dtype=torch.float64)).metrics["mu"]
    assert torch.equal(got["mu"], want)
