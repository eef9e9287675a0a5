"""Nearby settings touch only the units where they mean something, shared units are
tabled once, and the run's messages (labels, not-run notes, progress, report) are plain."""

import numpy as np
import pandas as pd
import pytest

from rankcollapse.experiments import plots, report, runner
from rankcollapse.experiments.claims import VERDICTS as C_VERDICTS
from rankcollapse.experiments.config import effective_override, load_config
from rankcollapse.sweep.units import Unit



def _unit(**params):
    return Unit("simulate", {"mask": "complete", "variant": "pure", "value": "gaussian", "seed": 0, **params}, "fig2")


@pytest.mark.parametrize("params, override, expected", [
    ({"variant": "pure"}, {"norm": "layernorm"}, {}),  # pure SA has no norm to change
    ({"variant": "skip"}, {"norm": "rmsnorm"}, {}),
    ({"variant": "sphere"}, {"norm": "layernorm"}, {"norm": "layernorm"}),
    ({"variant": "post_ln"}, {"norm": "rmsnorm"}, {"norm": "rmsnorm"}),
    ({"variant": "post_ln"}, {"norm": "layernorm"}, {}),  # already layernorm
    ({"mask": "causal"}, {"window": 3}, {}),  # no window to change
    ({"mask": "sliding_window:w=9"}, {"window": 3}, {"window": 3}),
    ({}, {"value": "gaussian"}, {}),
    ({}, {"value": "orthogonal", "init_scale": 2.0}, {"value": "orthogonal", "init_scale": 2.0}),
])
def test_effective_override_leaves_meaningless_keys_out(params, override, expected):
    assert effective_override(_unit(**params), override) == expected


def test_norm_setting_changes_only_the_ln_side(fig2_nearby):
    cfgs, units, data = runner.plan("fig2", "smoke", 0)
    claim = next(c for c in load_config("fig2")["claims"] if c["id"] == "C05")
    label, _, changed, reused = next(x for x in runner.nearby_units(cfgs[0], claim, units) if x[0] == "norm=rmsnorm")
    # control units (role: control, e.g. post_ln with W_V = 0) are not nearby bases
    assert {u.params["variant"] for u in changed} == {"post_ln"} and len(changed) == 4
    assert all(u.params["norm"] == "rmsnorm" and u.params["setting"] == label for u in changed)
    assert {u.params["variant"] for u in reused} == {"skip"} and len(reused) == 4

    res = fig2_nearby  # the same plan (seed 0), computed, decided and its nearby settings run
    records, table = res.claims, res.table[res.table.setting == "default"]
    near = res.table[res.table.setting != "default"]
    assert len(table) + len(near) == len(res.table) and len(near) > 0
    # every nearby unit once: one row per (unit, seed, layer, metric), claims listed
    assert not near.duplicated(["unit", "seed", "layer", "metric", "point"]).any()
    assert set(near.loc[near.setting == "norm=rmsnorm", "claims"]) == {"C05"}
    # nearby settings run for every decided claim, whatever its verdict
    assert {c["id"] for c in records if c["nearby"]} >= {"C01", "C02", "C04", "C05"}
    assert len(near[(near.setting == "norm=rmsnorm") & (near.metric == "mu")]) == 4 * 33  # depth 2 x 16
    assert set(near.loc[near.setting == "norm=rmsnorm", "variant"]) == {"post_ln"}
    # the skip side of the norm setting reads the default skip rows: same numbers
    c05 = next(r for r in records if r["id"] == "C05")
    fresh = next(r for r in runner.evaluate_claims(cfgs, table, "smoke") if r["id"] == "C05")
    growth = lambda checks: [c["lhs"]["mean"] for c in checks if c["check"].startswith("skip grows")]  # noqa: E731
    assert growth(next(n for n in c05["nearby"] if n["setting"] == "norm=rmsnorm")["checks"]) == pytest.approx(
        growth(fresh["checks"]))


def test_nearby_settings_run_for_every_decided_claim(fig2_nearby):
    res = fig2_nearby
    cfg = {c["id"]: c for c in runner.load_config("fig2")["claims"]}
    for c in res.claims:
        if c["verdict"] != "not run" and cfg[c["id"]].get("nearby"):
            assert [n["setting"] for n in c["nearby"]] == [runner.setting_label(o) for o in cfg[c["id"]]["nearby"]], c["id"]
            assert set(res.table["setting"]) >= {n["setting"] for n in c["nearby"]}
            assert all(n["verdict"] in C_VERDICTS for n in c["nearby"])


def test_excluded_model_is_named_plainly(fig2_nearby):
    c03 = next(c for c in fig2_nearby.claims if c["id"] == "C03")
    assert c03["verdict"] == "not run"
    assert "needs model smollm2, which --scale smoke excludes" in c03["notes"]
    assert "no rows for" not in c03["notes"]


def test_unit_label_has_no_seed_without_weights():
    assert Unit("probe", {"model": "minilm", "seed": -1}).label == "probe[model=minilm]"
    assert _unit(seed=3).label == "simulate[mask=complete, variant=pure, value=gaussian, seed=3]"


def test_progress_without_tty_is_one_line_per_unit(fake, tmp_path, capsys):
    cfgs, units, data = runner.plan("main", "smoke", 0)
    runner.compute_units(units, runner.RunContext(data, "cpu"), tmp_path, progress=True, title="main")
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"main: {len(units)} units, 0 cached, computing {len(units)} (serial, 1 worker)"
    assert [ln.split("]")[0] for ln in err[1:-1]] == [f"main [{k}/{len(units)}" for k in range(1, len(units) + 1)]
    assert len(err) == len(units) + 2 and err[-1].startswith(f"main: {len(units)} units (0 cached) in ")


def test_report_lists_evaluated_rules_and_links_aliased_figure():
    rules = report._rules_yaml([load_config("main")])
    assert "fig2 (evaluated by main)" in rules and "id: C02" in rules and "[]" not in rules
    figures = {"sim_mu_relative": {"aliases": ["fig2_mu_relative"]}}
    assert report.plot_link("fig2_mu_relative", figures).startswith('<a href="#fig-sim_mu_relative">')
    assert "not drawn" in report.plot_link("fig2_pretrained", figures)


def _rows(panel_values):
    return pd.DataFrame([{"variant": p, "point": "", "mean": v} for p, vals in panel_values.items() for v in vals])


def test_y_axis_shared_only_for_comparable_ranges():
    far = _rows({"pure": np.logspace(0, -16, 5), "skip": [1.0, 0.9, 0.6]})
    near = _rows({"pure": np.logspace(0, -16, 5), "sphere": np.logspace(0, -15, 5)})
    assert plots._share_y(far, "variant", ["pure", "skip"], log=True) is False
    assert plots._share_y(near, "variant", ["pure", "sphere"], log=True) is True
