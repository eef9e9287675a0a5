"""The claims rule engine on hand-built tables with known answers: quantities, intervals,
one condition per selection, dtype floors, the depth check, overrides, verdicts."""

import math

import numpy as np
import pandas as pd
import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import claims as C
from rankcollapse.experiments.config import EXPERIMENTS, load_config
from rankcollapse.experiments.quantities import AmbiguousSelection, EvalContext, floor_of
from rankcollapse.experiments.table import COLUMNS, normalise, rows_from_metrics


def _curve(mask: str, variant: str, values, seed: int = 0, setting: str = "default", spread=(1.0, 1.0, 1.0),
           **labels) -> pd.DataFrame:
    vals = np.asarray(values, dtype=float)[:, None] * np.asarray(spread)[None, :]  # 3 windows
    return rows_from_metrics({"mu_relative": vals}, {"source": "simulate", "mask": mask, "mask_spec": mask,
                                                     "variant": variant, "seed": seed, "setting": setting,
                                                     "dtype": "float64", **labels})


@pytest.fixture
def table() -> pd.DataFrame:
    return pd.concat([
        _curve("complete", "pure", [1.0, 0.1, 0.01], seed=0),
        _curve("complete", "pure", [1.0, 0.2, 0.04], seed=1),
        _curve("complete", "sphere", [1.0, 0.9, 0.8], seed=0),
        _curve("complete", "sphere", [1.0, 0.5, 0.02], seed=1),
        _curve("complete", "sphere", [2.0, 2.0, 2.0], seed=0, setting="init_scale=2"),
    ], ignore_index=True)


def _q(variant, stat="change", layer="last", mask="complete"):
    return {"stat": stat, "metric": "mu_relative", "layer": layer, "select": {"variant": variant, "mask_spec": mask}}


def test_quantities_pool_windows_and_seeds(table):
    v = C.quantity(table, _q("pure", "value", 1))
    assert v.point == pytest.approx(0.15) and v.per_seed == pytest.approx({0: 0.1, 1: 0.2})
    assert C.quantity(table, _q("pure")).point == pytest.approx(0.025)  # ratio of pooled means
    assert C.quantity(table, {"stat": "min", "metric": "mu_relative", "select": {"variant": "sphere"}}).point == pytest.approx(0.41)
    ratio = C.quantity(table, {"stat": "ratio", "num": _q("sphere"), "den": _q("pure")})
    assert ratio.point == pytest.approx(0.41 / 0.025) and ratio.per_seed == pytest.approx({0: 80.0, 1: 0.5})
    assert C.quantity(table, {"const": 3}).point == 3.0
    # bootstrap replicates resample the two seeds: every replicate is one of the 3 seed mixes
    assert set(np.round(v.reps, 6)) <= {0.1, 0.15, 0.2}


def test_fitted_rate_is_the_geometric_factor():
    t = _curve("complete", "pure", 0.5 * 0.9 ** np.arange(11), spread=(1.0, 1.01, 1.02))
    q = {"stat": "rate", "metric": "mu_relative", "select": {"variant": "pure"}}
    v = C.quantity(t, q)
    assert v.point == pytest.approx(0.9, rel=1e-12) and np.allclose(v.reps, 0.9)


def test_interval_must_clear_the_threshold():
    # two seeds disagree: seed 0 keeps 100x, seed 1 only 2x -> the point clears 10x, the interval does not
    t = pd.concat([_curve("complete", "sphere", [1.0, 1.0], seed=0), _curve("complete", "sphere", [1.0, 0.02], seed=1),
                   _curve("complete", "pure", [1.0, 0.01], seed=0), _curve("complete", "pure", [1.0, 0.01], seed=1)],
                  ignore_index=True)
    res = C.evaluate_check(t, {"lhs": _q("sphere"), "op": ">=", "factor": 10, "rhs": _q("pure")}, ctx=EvalContext(n_boot=400))
    assert res["value"] == pytest.approx(51.0) and res["interval"][0] < 10 < res["interval"][1]
    assert res["outcome"] == "undecided"
    assert C.verdict_from([res["outcome"]]) == "mixed"


def test_selection_of_two_conditions_is_an_error_naming_both():
    t = pd.concat([_curve("sliding_window:w=3", "pure", [1.0, 0.5]), _curve("sliding_window:w=33", "pure", [1.0, 0.9])],
                  ignore_index=True)
    t["mask"] = "sliding_window"
    q = {"stat": "change", "metric": "mu_relative", "layer": 1, "select": {"variant": "pure", "mask": "sliding_window"}}
    with pytest.raises(AmbiguousSelection, match=r"2 conditions.*sliding_window:w=3.*sliding_window:w=33"):
        C.quantity(t, q)
    assert C.quantity(t, {**q, "select": {"variant": "pure", "mask_spec": "sliding_window:w=3"}}).point == pytest.approx(0.5)


def test_values_at_the_dtype_floor_are_collapsed_and_equal():
    t = pd.concat([_curve("complete", "pure", [1.0, 1.6e-9], dtype="float32"),
                   _curve("complete", "sphere", [1.0, 2.2e-8], dtype="float32")], ignore_index=True)
    check = {"lhs": _q("sphere"), "op": ">=", "factor": 10, "rhs": _q("pure")}
    res = C.evaluate_check(t, check)
    assert res["collapsed"] == [True, True] and res["value"] == 1.0 and res["outcome"] == "fails"
    t64 = t.assign(dtype="float64")  # in float64 both values are far above the floor: a real 13.75x
    assert C.evaluate_check(t64, check)["value"] == pytest.approx(2.2e-8 / 1.6e-9)
    assert floor_of("float32") == pytest.approx(1.1920929e-07) and floor_of("") == 0.0


def test_depth_check_flags_a_verdict_that_flips():
    # sphere keeps 10x more at depth 2 but not at depth 4: depth-sensitive
    t = pd.concat([_curve("complete", "sphere", [1.0, 0.5, 0.3, 0.01, 0.001], depth=4),
                   _curve("complete", "pure", [1.0, 0.5, 0.02, 0.005, 0.001], depth=4)], ignore_index=True)
    claim = {"id": "D", "effect": "e", "rule": {"checks": [{"lhs": _q("sphere"), "op": ">=", "factor": 10, "rhs": _q("pure")}]}}
    res = C.evaluate_claim(t, claim, depth=2)
    assert res["verdict"] == "mixed (depth-sensitive)" and res["verdict_at_depth"] == "reproduced"
    assert res["depth_check"] == {**res["depth_check"], "depth": 4, "verdict": "not reproduced"}
    assert C.evaluate_claim(t, claim, depth=2, depth_check=False)["verdict"] == "reproduced"


@pytest.mark.parametrize("outcomes, expect, verdict", [
    (["holds", "holds"], "all", "reproduced"),
    (["fails", "fails"], "all", "not reproduced"),
    (["holds", "fails"], "all", "mixed"),
    (["undecided"], "all", "mixed"),
    (["holds", "fails"], "mixed", "reproduced"),
    (["holds", "holds"], "mixed", "not reproduced"),
    (["undecided", "undecided"], "mixed", "mixed"),
    ([], "all", "not run"),
])
def test_verdict_from(outcomes, expect, verdict):
    assert C.verdict_from(outcomes, expect) == verdict


def test_within_is_two_sided():
    t = _curve("complete", "post_ln", [1.0, 3.0, 30.0])
    assert C.evaluate_check(t, {"lhs": _q("post_ln", layer=1), "op": "within", "factor": 10})["outcome"] == "holds"
    assert C.evaluate_check(t, {"lhs": _q("post_ln", layer=2), "op": "within", "factor": 10})["outcome"] == "fails"


def test_claim_for_each_informational_and_missing(table):
    claim = {"id": "X", "effect": "e", "rule": {"checks": [
        {"name": "collapse", "for_each": {"variant": ["pure"]}, "lhs": _q("{variant}"), "op": "<=", "factor": 0.05},
        {"name": "info", "informational": True, "lhs": _q("sphere"), "op": ">=", "factor": 100},
    ]}}
    res = C.evaluate_claim(table, claim)
    assert res["verdict"] == "reproduced"  # the failing check is informational only
    assert res["checks"][0]["check"] == "collapse [variant=pure]" and res["measured"] == pytest.approx(0.025)
    missing = C.evaluate_claim(table, {"id": "Y", "effect": "e", "rule": {"checks": [{"lhs": _q("skip")}]}})
    assert missing["verdict"] == "not run" and "variant=skip" in missing["missing"]


def test_override_reads_changed_setting(table):
    claim = {"id": "Z", "effect": "e", "rule": {"checks": [
        {"lhs": {"stat": "value", "metric": "mu_relative", "layer": 2, "select": {"variant": "sphere", "init_scale": 1.0}},
         "op": ">=", "factor": 1.5}]}}
    table = table.assign(init_scale=np.where(table["setting"] == "default", 1.0, 2.0))
    assert C.evaluate_claim(table, claim)["verdict"] == "not reproduced"
    near = C.evaluate_claim(table, claim, setting="init_scale=2", override={"init_scale": 2.0})
    assert near["verdict"] == "reproduced"


def test_window_override_rewrites_the_mask_spec():
    rule = {"checks": [{"lhs": {"select": {"mask_spec": "sliding_window:w=9"}}, "rhs": {"select": {"mask_spec": "causal"}}}]}
    out = C._override_rule(rule, {"window": 3})
    assert out["checks"][0]["lhs"]["select"]["mask_spec"] == "sliding_window:w=3"
    assert out["checks"][0]["rhs"]["select"]["mask_spec"] == "causal"


def test_bad_operator_raises(table):
    with pytest.raises(ConfigError, match="operator"):
        C.evaluate_check(table, {"lhs": _q("pure"), "op": "=="})


def test_configs_hold_the_twelve_claims_once():
    ids = [c["id"] for n in EXPERIMENTS for c in load_config(n).get("claims", [])]
    assert sorted(ids) == [f"C{k:02d}" for k in range(1, 13)]
    for n in EXPERIMENTS:
        for claim in load_config(n).get("claims", []):
            assert claim["effect"] and claim["paper_effect"] in ("Helped", "Hurt", "Mixed")
            if claim.get("original"):  # an amended rule keeps its original verdict and the reason
                assert claim["original"]["verdict"] in C.VERDICTS and claim["original"]["reason"].strip()
            for check in C.expand_checks(claim["rule"]["checks"]):
                for side in ("lhs", "rhs"):
                    _assert_columns(check.get(side, {"const": 1}))


def _assert_columns(q):
    if "const" in q:
        return
    if q.get("stat") in ("ratio", "difference"):
        _assert_columns(q["num"]), _assert_columns(q["den"])
        return
    assert set(q.get("select", {})) <= set(COLUMNS), q
    assert "mask" not in q.get("select", {}), f"select the full mask_spec, not the family: {q}"


def test_normalise_fills_columns():
    df = normalise(pd.DataFrame({"layer": [0], "metric": ["mu"], "mean": [1.0]}), {"model": "m"})
    assert list(df.columns) == list(COLUMNS)
    assert df.loc[0, "seed"] == -1 and df.loc[0, "setting"] == "default" and math.isnan(df.loc[0, "q25"])
    assert len(df.loc[0, "values"]) == 0


def test_min_from_layer_and_final_norm_left_out():
    vals = np.array([[0.6], [1.0], [1.0], [0.2]])
    t = rows_from_metrics({"rank_fraction": vals}, {"source": "probe", "model": "m", "variant": "full"},
                          layers=[0, 1, 2, 2], points=["embeddings", "layer.0.output", "layer.1.output", "final_norm"])
    q = {"stat": "min", "metric": "rank_fraction", "select": {"model": "m"}}
    assert C.quantity(t, q).point == 0.6
    assert C.quantity(t, {**q, "from_layer": 1}).point == 1.0  # final_norm (0.2) not averaged in
    assert C.quantity(t, {**q, "select": {"model": "m", "point": "final_norm"}}).point == 0.2


def test_c02_and_c11_read_one_comparison():
    fig2 = {c["id"]: c for c in load_config("fig2")["claims"]}
    c02, c11 = (C.expand_checks(fig2[k]["rule"]["checks"]) for k in ("C02", "C11"))
    scored = [c for c in c02 if not c.get("informational")]
    assert [(c["lhs"], c["rhs"], c["factor"], c["op"]) for c in c11 if not c.get("informational")] == [
        (c["lhs"], c["rhs"], c["factor"], c["op"]) for c in scored]
    # the asymptotic reading of each side (rate vs 1, vs the Theorem-1 envelope) is shared too
    rates = lambda checks: [(c["name"], c["lhs"], c.get("rhs")) for c in checks if "rate" in c["name"]  # noqa: E731
                            and ("< 1" in c["name"] or "envelope" in c["name"])]
    assert rates(c11) == rates(c02) and len(rates(c02)) == 12
    assert fig2["C11"]["rule"]["expect"] == "mixed" and fig2["C02"]["rule"].get("expect", "all") == "all"


def test_decisive_check_is_the_nearest_to_its_threshold():
    far = {"check": "far", "op": ">=", "threshold": 2.0, "interval": [20.0, 40.0], "outcome": "holds"}
    near = {"check": "near", "op": "<=", "threshold": 1.0, "interval": [0.5, 0.9], "outcome": "holds"}
    within = {"check": "within", "op": "within", "threshold": 10.0, "interval": [0.105, 1.0], "outcome": "holds"}
    assert C.decisive([far, near], "reproduced")["check"] == "near"
    assert C.decisive([far, near, within], "reproduced")["check"] == "within"  # 0.105 is 5 % above the lower bound 0.1
    failing = {**far, "check": "fails", "interval": [0.5, 1.0], "outcome": "fails"}
    assert C.decisive([near, failing], "not reproduced")["check"] == "fails"


def test_envelope_rate_quantity_is_the_theorem_constant(table):
    # complete mask on 4 tokens: radius 1, deg_max 4, rate 1 - 1/4; no row is read
    q = {"stat": "envelope_rate", "n": 4, "select": {"mask_spec": "complete"}}
    v = C.quantity(table.iloc[:0], q, ctx=EvalContext(n_boot=20))
    assert v.point == pytest.approx(0.75, abs=1e-15) and np.all(v.reps == v.point)
    # pure SA's pooled means 0.15 -> 0.025 over layers 1..2: rate 1/6, ratio (1/6) / 0.75 = 2/9
    check = {"lhs": _q("pure", stat="rate"), "op": "<=", "factor": 1, "rhs": q}
    res = C.evaluate_check(table, check, ctx=EvalContext(n_boot=200))
    assert res["value"] == pytest.approx(2 / 9, rel=1e-12)
    assert res["outcome"] == "holds" and res["interval"][1] < 1
    assert "theorem1_envelope_rate[mask_spec=complete,N=4]" in res["text"]
    with pytest.raises(ConfigError, match="mask_spec and n"):
        C.quantity(table, {"stat": "envelope_rate", "select": {"mask_spec": "complete"}})


def test_window_override_rewrites_the_envelope_mask():
    claim = {"id": "W", "effect": "e", "rule": {"checks": [{"for_each": {"mask": ["sliding_window:w=9"]},
             "lhs": {"stat": "envelope_rate", "n": 16, "select": {"mask_spec": "{mask}"}}, "op": "<", "rhs": {"const": 1.0}}]}}
    from rankcollapse.theory import envelope_rate

    res = C.evaluate_claim(pd.DataFrame(), claim, setting="window=3", override={"window": 3}, n_boot=10)
    assert res["checks"][0]["value"] == envelope_rate("sliding_window:w=3", n=16)
