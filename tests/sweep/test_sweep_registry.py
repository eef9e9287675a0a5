"""The sweep engine's unit registry: a new kind is one entry and one function and runs
through ``run_units`` with the cache; keys of the registered kinds are those the
earlier code wrote (a cache written before stays readable); one terminal test."""

import pandas as pd
import pytest

import rankcollapse.experiments.units  # noqa: F401  (registers the experiments' kinds)
import rankcollapse.phase.sweep  # noqa: F401  (registers phase_cell)
from rankcollapse import _io, _progress
from rankcollapse.errors import ConfigError
from rankcollapse.sweep import units as sweep_units
from rankcollapse.sweep.cache import UnitCache
from rankcollapse.sweep.engine import run_units
from rankcollapse.sweep.progress import UnitProgress
from rankcollapse.sweep.units import Unit, register_unit_kind, unit_kind, unit_kinds

CALLS = []


def squares(unit, ctx):
    """Toy kind: rows k, k**2 for k < n (a closed form to check the frames against)."""
    CALLS.append(unit.params["n"])
    n = unit.params["n"]
    return pd.DataFrame({"k": range(n), "square": [float(k * k) for k in range(n)]})


@pytest.fixture
def toy():
    """Register the toy kind for one test; it is removed after it."""
    CALLS.clear()
    yield register_unit_kind("squares", squares, version=1, label=lambda u: f"squares[n={u.params['n']}]")
    sweep_units._KINDS.pop("squares")


def test_a_registered_toy_kind_runs_and_the_second_run_reads_the_cache(toy, tmp_path):
    units = [Unit("squares", {"n": n}) for n in (3, 1, 2)]
    frames, timings = run_units(units, None, tmp_path, progress=False)
    assert CALLS == [3, 1, 2]
    for u, f in zip(units, frames):
        n = u.params["n"]
        assert f["square"].tolist() == [float(k * k) for k in range(n)]
    assert [t["unit"] for t in timings] == ["squares[n=3]", "squares[n=1]", "squares[n=2]"]
    assert not any(t["cached"] for t in timings)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"squares-{u.hash}.parquet" for u in units)

    again, timings = run_units(units, None, tmp_path, progress=False)
    assert CALLS == [3, 1, 2]  # nothing computed the second time
    assert all(t["cached"] and t["worker"] == "cache" for t in timings)
    for a, b in zip(frames, again):
        pd.testing.assert_frame_equal(a, b)


def test_compute_order_and_a_lazily_made_executor(toy, tmp_path):
    made = []

    def start():
        from rankcollapse.sweep.executors import SerialExecutor

        made.append(SerialExecutor())
        return made[-1]

    units = [Unit("squares", {"n": n}) for n in (3, 1, 2)]
    frames, timings = run_units(units, None, tmp_path, progress=False, order=lambda u: u.params["n"], executor=start)
    assert CALLS == [1, 2, 3] and len(made) == 1
    assert [len(f) for f in frames] == [3, 1, 2]  # frames in the order given, whatever the compute order
    run_units(units, None, tmp_path, progress=False, executor=start)
    assert len(made) == 1  # everything cached: no executor started


def test_the_kind_version_is_part_of_the_key(toy, monkeypatch):
    u = Unit("squares", {"n": 2})
    before = u.hash
    monkeypatch.setitem(sweep_units._KINDS, "squares", sweep_units.UnitKind("squares", squares, 2))
    assert u.hash != before


def test_duplicates_and_unknown_kinds_are_refused(toy, tmp_path):
    assert register_unit_kind("squares", squares, version=1, label=toy.label) is toy  # the same entry again: a no-op
    with pytest.raises(ConfigError, match="unit kind 'squares' is already registered"):
        register_unit_kind("squares", squares, version=2)
    with pytest.raises(ConfigError, match="unit kind 'simulate' is already registered"):
        register_unit_kind("simulate", squares, version=3, group="experiments")
    with pytest.raises(ConfigError, match="version must be an integer >= 0"):
        register_unit_kind("cubes", squares, version=-1)
    with pytest.raises(ConfigError, match="unknown unit kind 'cubes'; registered: .*squares"):
        Unit("cubes", {}).hash
    with pytest.raises(ConfigError, match="unknown unit kind 'cubes'"):
        run_units([Unit("cubes", {})], None, tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_experiment_configs_take_only_the_experiments_kinds():
    import copy

    from rankcollapse.experiments.config import load_config
    from rankcollapse.experiments.schema import validate_config

    kinds = ("simulate", "probe", "pretrained_sa", "theory", "mask_influence", "model_influence", "temperature_law",
             "gap_count", "temperature_switch", "power_method", "energy", "phase_sink")
    assert unit_kinds("experiments") == kinds  # the schema imported every experiment kind's module
    assert "phase_cell" in unit_kinds()
    cfg = copy.deepcopy(load_config("fig3"))
    cfg["units"][0]["kind"] = "phase_cell"
    with pytest.raises(ConfigError, match=r"config fig3: units\[0\]: kind: unknown unit kind; experiment configs "
                                          r"take simulate, probe, pretrained_sa, theory, mask_influence, model_influence, temperature_law, "
                                          r"gap_count, temperature_switch, power_method, energy, phase_sink "
                                          r"\(got 'phase_cell'\)"):
        validate_config(cfg, "fig3")


@pytest.mark.parametrize("kind, params, key", [
    ("simulate", {"mask": "causal", "seed": 0}, "b42d37d88024"),
    ("probe", {"model": "minilm"}, "cdeebd1a43c5"),  # probe version 4: attention rows from SDPA calls
    ("pretrained_sa", {"d_qk": 1.0}, "67a045ff2e93"),
    ("theory", {"check": "x"}, "885c797b70a2"),
    # the parameters are hashed as they are spelt (a text file's path left out)
    ("simulate", {"mask": "causal", "seed": 0, "n_samples": 8, "data": {"corpus": "wikipedia", "n_tokens": 128, "seed": 0}},
     "ca38942b2957"),
    ("theory", {"check": "equilibria", "n_tokens": 16, "d_model": 8, "eq_n_tokens": 4, "eq_d_model": 4,
                "rate_n_tokens": 128}, "c8785d9b7416"),
    # phase_cell version 7: its parameters name the inputs per seed n_samples; rows carry sink_mass
    ("phase_cell", {"cells": [{"qk_scale": 1.0, "depth": 4}], "n_samples": 2, "seeds": 1, "seed": 0}, "696e2b262d4d"),
])
def test_unit_keys_are_those_the_earlier_code_wrote(monkeypatch, kind, params, key):
    """Keys computed by the code before the sweep engine was one package (experiments'
    CACHE_VERSION, phase's PHASE_VERSION), with the code fingerprint held fixed: a cache
    written by that code is read, not recomputed."""

    monkeypatch.setattr(sweep_units, "code_fingerprint", lambda: _io.config_hash({"numerics": 2, "torch": "2.5.1"}))
    assert Unit(kind, params).hash == key
    assert unit_kind(kind).version == {"theory": 4, "phase_cell": 7, "probe": 4}.get(kind, 3)


def test_one_terminal_test_for_every_progress_display(monkeypatch, capsys):
    monkeypatch.setattr(_progress, "stderr_is_tty", lambda: True)
    assert UnitProgress("t", 2).tty
    with _progress.steps(2, "steps") as s:
        assert s._progress is not None  # a bar, because the one test said "terminal"
    monkeypatch.setattr(_progress, "stderr_is_tty", lambda: False)
    assert not UnitProgress("t", 2).tty
    with _progress.steps(2, "steps") as s:
        assert s._progress is None



def spelt_n(params):
    """Toy ``key_params``: the key reads ``n`` as ``count``."""
    return {("count" if k == "n" else k): v for k, v in params.items()}


def test_key_params_is_what_the_key_hashes():
    register_unit_kind("spelt", squares, version=1, key_params=spelt_n)
    try:
        key = {"kind": "spelt", "params": {"count": 3}, "v": 1, "code": sweep_units.code_fingerprint()}
        assert Unit("spelt", {"n": 3}).hash == _io.config_hash(key)
        with pytest.raises(ConfigError, match="already registered"):  # another key_params is another kind
            register_unit_kind("spelt", squares, version=1)
    finally:
        sweep_units._KINDS.pop("spelt")


def test_live_bar_shows_a_unit_label_in_brackets_literally():
    """rich reads ``[...]`` as markup: a control's label must still be shown as written."""
    with UnitProgress("probe", 2, tty=True) as p:
        p.running("smollm2 [random-init, seed 0]")
        task = p._bar.tasks[0]
        shown = p._bar.columns[0].render(task).plain
    assert "smollm2 [random-init, seed 0]" in shown


def test_a_kind_resolves_in_a_fresh_process_without_importing_its_module_first():
    """The kinds are registered by importing their modules; a lookup imports them on demand
    (``sweep.units.KIND_MODULES``), and importing the package imports none of them."""
    import json
    import subprocess
    import sys

    probe = """
import json, sys
import rankcollapse
from rankcollapse.sweep import Unit, unit_kind
loaded = lambda: sorted(m for m in sys.modules if m.startswith(("rankcollapse.experiments", "rankcollapse.phase")))
before = loaded()
u = Unit("simulate", {"mask": "causal", "seed": 0})
print(json.dumps({"before": before, "label": u.label, "hash": u.hash, "group": unit_kind("simulate").group,
                  "phase_cell": unit_kind("phase_cell").version, "after": "rankcollapse.experiments.units" in loaded()}))
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["before"] == []
    assert out["label"] == "simulate[mask=causal, seed=0]"
    assert out["hash"] == Unit("simulate", {"mask": "causal", "seed": 0}).hash  # the same key as here
    assert (out["group"], out["phase_cell"], out["after"]) == ("experiments", 7, True)
