"""A run's progress announces its whole plan (nearby settings included) and its ETA runs
to the end of the run; unit labels tell every unit apart; the cost of the numbers is
kept with the cache and survives a rerun from the cache."""

import json

import pandas as pd
import pytest

from rankcollapse.experiments import ExecutionConfig, StorageConfig, runner
from rankcollapse.sweep.cache import UnitCache
from rankcollapse.sweep import progress as progress_mod
from rankcollapse.sweep.executors import Done
from rankcollapse.sweep.units import Unit, unit_labels

QUIET = ExecutionConfig(progress=False)


def _planned(name, scale):
    cfgs, units, _ = runner.plan(name, scale, 0)
    return units, runner.plan_units(runner.nearby_plan(cfgs, units))


def test_eta_counts_every_planned_unit(monkeypatch, capsys):
    clock = iter([0.0, 10.0, 20.0, 30.0, 40.0, 50.0])
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: next(clock))
    with progress_mod.UnitProgress("main", 5, tty=False) as bar:
        bar.start(1, 4, 2, "processes", groups=[("default settings", 3), ("nearby settings", 2)])
        for k in range(4):
            bar.finished(f"u{k}", 10.0)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "main: 5 units (default settings 3, nearby settings 2), 1 cached, computing 4 (processes, 2 workers)"
    # 10 s per computed unit on 2 workers: ETA = 10 s x units left of the whole plan / 2
    assert [ln.split("ETA ")[1] for ln in err[1:5]] == ["15 s)", "10 s)", "5 s)", "0 s)"]
    assert [ln.split("]")[0] for ln in err[1:5]] == [f"main [{k}/5" for k in (2, 3, 4, 5)]


def test_eta_times_each_cost_class_and_is_never_0_s_while_units_remain(capsys):
    """Three mask units of 0.05 s leave a SmolLM2 probe to run: the ETA says a unit is not
    yet timed (not 0 s); once one probe is timed the next probe's estimate is its time."""
    from rankcollapse.sweep.progress import cost_class, format_eta

    masks = [Unit("mask_influence", {"mask": f"m{k}"}) for k in range(3)]
    probes = [Unit("model_influence", {"model": "smollm2", "seed": s}) for s in (0, 1)]
    assert cost_class(probes[0]) == "model_influence[smollm2]" and cost_class(masks[0]) == "mask_influence"
    with progress_mod.UnitProgress("influence", 5, tty=False) as bar:
        bar.expect([*masks, *probes])
        bar.start(0, 5, 1, "serial")
        for u in masks:
            bar.finished(u.params["mask"], 0.05, unit=u)
        bar.finished("smollm2 0", 60.0, unit=probes[0])
        bar.finished("smollm2 1", 58.0, unit=probes[1])
    err = capsys.readouterr().err.splitlines()
    etas = [ln.split("s (elapsed ")[1].split(", ", 1)[1] for ln in err[1:6]]
    assert etas == ["ETA unknown (2 units not yet timed))", "ETA unknown (2 units not yet timed))",
                    "ETA unknown (2 units not yet timed))", "ETA 60 s)", "ETA 0 s)"]
    assert format_eta(0.1, 0, 1) == "ETA < 1 s" and format_eta(12.4, 1, 3) == "ETA ≥ 12 s (1 unit not yet timed)"
    assert format_eta(0.0, 0, 0) == "ETA 0 s"


def test_dropped_units_leave_the_total(capsys):
    with progress_mod.UnitProgress("main", 6, tty=False) as bar:
        bar.start(2, 4, 1, "serial")
        bar.drop(3, "nearby settings of C03, not decided", cached=1)
        bar.finished("u", 1.0)
    err = capsys.readouterr().err.splitlines()
    assert err[1] == "main: 3 planned units not run (nearby settings of C03, not decided); 3 units in all"
    assert err[2].startswith("main [2/3] u ")


def test_run_announces_default_and_nearby_units_up_front(fake, tmp_path, capsys):
    units, near = _planned("fig3", "smoke")
    assert len(near) > 0
    res = runner.run_experiment("fig3", "smoke", tmp_path / "run", execution=ExecutionConfig(progress=True), storage=StorageConfig(write=False))
    err = capsys.readouterr().err.splitlines()
    total = len(units) + len(near)
    # the cost model's estimate first (one experiment: only the total), then the plan
    assert err[0].startswith(f"estimate: total: {total} units, 0 cached, {total} to compute: ~")
    assert err[1] == (f"fig3: {total} units (default settings {len(units)}, nearby settings {len(near)}), "
                      f"0 cached, computing {total} (serial, 1 worker)")
    done = [ln for ln in err if ln.startswith("fig3 [")]
    dropped = sum(int(ln.split(": ")[1].split()[0]) for ln in err if "planned units not run" in ln)
    assert len(done) == total - dropped == len(res.timings)
    assert done[-1].startswith(f"fig3 [{total - dropped}/{total - dropped}]") and done[-1].endswith("ETA 0 s)")
    assert err[-1].startswith(f"fig3: {total - dropped} units (0 cached) in ")


def test_labels_name_every_field_that_tells_units_apart():
    units, near = _planned("all", "quick")
    labels = unit_labels(units + near)
    assert len(set(labels.values())) == len(units + near)
    sphere = [labels[u.hash] for u in units if u.params.get("variant") == "sphere" and u.params.get("mask") == "complete"
              and u.params.get("value") == "gaussian" and u.params.get("seed") == 0]
    assert sorted(sphere) == ["simulate[model=minilm, mask=complete, variant=sphere, sphere_radius=19.5959, value=gaussian, d_qk=1, seed=0]",
                              "simulate[model=minilm, mask=complete, variant=sphere, value=gaussian, d_qk=1, seed=0]"]
    probes = sorted(labels[u.hash] for u in units if u.kind == "probe" and u.params["model"] == "minilm")
    # the paper's probes and geometry's (trained and random-init) differ in metrics and control
    paper = "metrics=[mu,mu_relative,avg_abs_cos,rank_fraction,sigma_min,max_token_share]"
    geometry = ("metrics=[effective_rank,max_norm_ratio,max_norm_position,top_singular_share,max_token_sigma_share,"
                "matrix_entropy,alpha_req,sink_mass,sink_head_fraction,sink_value_ratio,sink_contribution]")
    assert probes == [f"probe[model=minilm, control=random-init, {geometry}]", f"probe[model=minilm, drop=[], {paper}]",
                      f"probe[model=minilm, drop=[norm], {paper}]", f"probe[model=minilm, {geometry}]"]


def test_cache_keeps_the_compute_cost(tmp_path):
    cache = UnitCache(tmp_path)
    a, b = Unit("theory", {"check": "a"}), Unit("theory", {"check": "b"})
    frame = pd.DataFrame({"layer": [0, 1], "mean": [1.0, 0.5]})
    cache.put(a, frame, {"seconds": 12.5, "cpu_seconds": 11.0, "worker": "h:1"})
    cache.put(b, frame)
    pd.testing.assert_frame_equal(cache.get(a), frame)
    assert cache.cost(a) == {"seconds": 12.5, "cpu_seconds": 11.0, "worker": "h:1"}
    assert cache.cost(b) is None and cache.cost(Unit("theory", {"check": "c"})) is None


class _SlowExecutor:
    """Runs units in this process and reports 5 s wall, 4 s CPU for each."""

    name, workers = "serial", 1

    def map(self, units, ctx, table):
        for i, u in enumerate(units):
            yield Done(i, table[u.kind](u, ctx), 5.0, 4.0, "w:1")

    def close(self):
        pass


def test_cached_rerun_keeps_what_the_numbers_cost(fake, monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "make_executor", lambda *a, **k: _SlowExecutor())
    out = tmp_path / "run"
    first = runner.run_experiment("theory", "smoke", out, execution=QUIET)
    n = len(first.timings)
    cost1 = json.loads((out / "config.json").read_text())["cost"]
    assert cost1["unit_seconds"] == pytest.approx(5.0 * n) and cost1["unit_cpu_seconds"] == pytest.approx(4.0 * n)
    assert cost1["units_computed"] == n and cost1["units_cached"] == 0
    calls = fake.calls
    runner.run_experiment("theory", "smoke", out, execution=QUIET)
    assert fake.calls == calls  # nothing recomputed
    cfg = json.loads((out / "config.json").read_text())
    cost2 = cfg["cost"]
    assert cost2["unit_seconds"] == cost1["unit_seconds"] and cost2["unit_cpu_seconds"] == cost1["unit_cpu_seconds"]
    assert cost2["units_computed"] == 0 and cost2["units_cached"] == n and cost2["units_cost_unknown"] == 0
    assert all(t["cached"] and t["compute_seconds"] == 5.0 and t["computed_at"] for t in cfg["timings"])
    html = (out / "report.html").read_text()
    assert f"numbers computed in {5 * n} s of unit time ({4 * n} CPU-s)" in html
    assert f"0 units computed, {n} read from the cache" in html
