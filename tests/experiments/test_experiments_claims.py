"""The claims rule engine on hand-built tables with known answers: quantities, intervals,
one condition per selection, dtype floors, the depth check, overrides, verdicts."""

import math

import numpy as np
import pandas as pd
import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import claims as C
from rankcollapse.experiments.config import EXPERIMENTS, load_config
from rankcollapse.experiments.quantities import EvalContext
from rankcollapse.experiments.selection import AmbiguousSelection
from rankcollapse.experiments.table import COLUMNS, normalise, rows_from_metrics
from rankcollapse.metrics.floor import relative_floor


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


def test_two_values_at_their_floor_are_undecidable_never_equal():
    # float32 rows (a probe's forward): both values within the float32 floor model -> no
    # ratio, not a forced 1
    t = pd.concat([_curve("complete", "pure", [1.0, 1e-1, 1.6e-9], dtype="float32"),
                   _curve("complete", "sphere", [1.0, 2e-1, 2.2e-8], dtype="float32")], ignore_index=True)
    check = {"lhs": _q("sphere"), "op": ">=", "factor": 10, "rhs": _q("pure")}
    res = C.evaluate_check(t, check)
    assert res["collapsed"] == [True, True] and res["bound"] == "undecidable"
    assert res["outcome"] == "undecidable" and res["decidable_to_layer"] == 1  # both above the float32 floor at layer 1
    assert C.verdict_from([res["outcome"]]) == C.UNDECIDABLE
    assert C.verdict_from([res["outcome"], "fails"]) == C.NOT_WHERE_DECIDABLE  # the failing check decides; the floors decide nothing
    t64 = t.assign(dtype="float64")  # float64 trajectories resolve both: a real 13.75x
    res64 = C.evaluate_check(t64, check)
    assert res64["value"] == pytest.approx(2.2e-8 / 1.6e-9) and res64["bound"] is None and res64["outcome"] == "holds"


def test_one_side_at_its_floor_gives_a_bound():
    # causal 2.8e-9 against complete 3e-16 (a few float64 eps: above eps itself, within the
    # round-off floor model relative_floor 3.9e-12): the ratio is at least 2.8e-9 / 3.9e-12,
    # a lower bound that clears >= 2 but cannot fail it, never the magnitude 2.8e-9 / 3e-16
    t = pd.concat([_curve("causal", "sphere", [1.0, 2.8e-9]), _curve("complete", "sphere", [1.0, 3e-16])],
                  ignore_index=True)
    up = {"lhs": _q("sphere", mask="causal"), "op": ">=", "factor": 2, "rhs": _q("sphere", mask="complete")}
    res = C.evaluate_check(t, up)
    floor = relative_floor("float64")
    assert res["bound"] == "lower" and res["value"] == pytest.approx(2.8e-9 / floor) and res["outcome"] == "holds"
    assert res["floors"] == [floor, floor] and res["dtypes"] == ["float64", "float64"]
    # the same bound against a threshold above it: undecided, never "fails"
    assert C.evaluate_check(t, {**up, "factor": 1e9})["outcome"] == "undecided"
    # the floored side on the left: an upper bound, which can break >= but not clear it
    down = {"lhs": _q("sphere", mask="complete"), "op": ">=", "factor": 2, "rhs": _q("sphere", mask="causal")}
    res = C.evaluate_check(t, down)
    assert res["bound"] == "upper" and res["outcome"] == "fails"
    assert C.evaluate_check(t, {**down, "factor": 1e-9})["outcome"] == "undecided"
    assert C.fmt_measured(1.26e7, [1.2e7, 1.3e7], "lower").startswith("≥ 1.2e+07 (bound")
    assert C.fmt_measured(None, None, "undecidable", 9) == "undecidable at this depth (decidable to layer 9)"


def test_depth_check_does_not_flip_on_an_undecidable_deep_reading():
    # both sides reach float64's floor between D = 2 and 2 D: 2 D cannot decide, D stands
    t = pd.concat([_curve("complete", "sphere", [1.0, 0.5, 0.3, 1e-17, 1e-18], depth=4),
                   _curve("complete", "pure", [1.0, 0.5, 0.02, 1e-17, 1e-19], depth=4)], ignore_index=True)
    claim = {"id": "U", "effect": "e", "rule": {"checks": [{"lhs": _q("sphere"), "op": ">=", "factor": 10, "rhs": _q("pure")}]}}
    res = C.evaluate_claim(t, claim, depth=2)
    assert C.registered_verdict(res) == "reproduced"
    assert res["depth_check"]["verdict"] == C.UNDECIDABLE and res["depth_check"]["decidable_to_layer"] == 2


def _windows(variant, rates, k=None):
    """mu_relative of the first ``len(rates)`` of 4 windows (inputs 1, 1, 3, 3), falling by
    ``rates`` per layer over 2 D = 4 layers; with ``k`` the rows at layers 3, 4 hold the
    first ``k`` windows only, as a simulate unit with ``depth_check_windows`` k writes them."""
    inputs = np.array([1.0, 1.0, 3.0, 3.0])[: len(rates)]
    vals = inputs * np.asarray(rates) ** np.arange(5)[:, None]  # (layers, windows)
    labels = {"source": "simulate", "mask": "complete", "mask_spec": "complete", "variant": variant, "depth": 4,
              "dtype": "float64"}
    if k is None:
        return rows_from_metrics({"mu_relative": vals}, labels)
    return pd.concat([rows_from_metrics({"mu_relative": vals[:3]}, labels),
                      rows_from_metrics({"mu_relative": vals[3:, :k]}, labels, layers=[3, 4])], ignore_index=True)


def test_depth_check_reads_the_windows_the_deep_rows_hold():
    """Layers beyond D on the first 2 of 4 windows: the claim depth reads all 4 (the
    numbers of a table with every window at every layer), the depth check reads windows
    0, 1 at every layer, its reference layer included (the numbers of a 2-window table)."""
    check = {"lhs": _q("sphere"), "op": ">=", "factor": 2, "rhs": _q("pure")}
    claim = {"id": "W", "effect": "e", "rule": {"checks": [check]}}
    sphere, pure = [0.5, 0.5, 0.9, 0.9], [0.1] * 4
    split = pd.concat([_windows("sphere", sphere, k=2), _windows("pure", pure, k=2)], ignore_index=True)
    full = pd.concat([_windows("sphere", sphere), _windows("pure", pure)], ignore_index=True)
    first = pd.concat([_windows("sphere", sphere[:2]), _windows("pure", pure[:2])], ignore_index=True)
    res = C.evaluate_claim(split, claim, depth=2, n_boot=200)
    ref = C.evaluate_claim(full, claim, depth=2, n_boot=200)
    ref_first = C.evaluate_claim(first, claim, depth=2, n_boot=200)["depth_check"]
    # claim depth: windows 0..3, (2 * 0.25 + 6 * 0.81) / 8 over 0.01
    assert res["measured"] == pytest.approx((2 * 0.25 + 6 * 0.81) / 8 / 0.01, rel=1e-12)
    assert (res["measured"], res["interval"], res["n_samples"]) == (ref["measured"], ref["interval"], 4)
    # 2 D: windows 0, 1 at layers 4 and 0 alike: 0.5^4 / 0.1^4, not 0.5^4 / 2 over the input of all four
    deep = res["depth_check"]
    assert deep["measured"] == pytest.approx(0.5 ** 4 / 0.1 ** 4, rel=1e-12) and deep["n_samples"] == 2
    assert (deep["measured"], deep["interval"]) == (ref_first["measured"], ref_first["interval"])
    assert ref["depth_check"]["n_samples"] == 4


def test_rates_under_causal_masks_are_marked_finite_depth():
    t = _curve("causal", "pure", 0.5 * 0.9 ** np.arange(6))
    res = C.evaluate_check(t, {"lhs": {"stat": "rate", "metric": "mu_relative", "select": {"mask_spec": "causal"}},
                               "op": "<", "rhs": {"const": 1.0}})
    assert "finite-depth reading" in res["finite_depth"] and "1..5" in res["finite_depth"]
    t2 = _curve("complete", "pure", 0.5 * 0.9 ** np.arange(6))
    assert "finite_depth" not in C.evaluate_check(
        t2, {"lhs": {"stat": "rate", "metric": "mu_relative", "select": {"mask_spec": "complete"}}, "op": "<"})


def test_depth_check_flags_a_verdict_that_flips():
    # sphere keeps 10x more at depth 2 but not at depth 4: depth-sensitive
    t = pd.concat([_curve("complete", "sphere", [1.0, 0.5, 0.3, 0.01, 0.001], depth=4),
                   _curve("complete", "pure", [1.0, 0.5, 0.02, 0.005, 0.001], depth=4)], ignore_index=True)
    claim = {"id": "D", "effect": "e", "rule": {"checks": [{"lhs": _q("sphere"), "op": ">=", "factor": 10, "rhs": _q("pure")}]}}
    res = C.evaluate_claim(t, claim, depth=2)
    assert res["verdict"] == "mixed (depth-sensitive)" and res["verdict_at_depth"] == "reproduced"
    assert res["depth_check"] == {**res["depth_check"], "depth": 4, "verdict": "not reproduced"}
    assert C.registered_verdict(C.evaluate_claim(t, claim, depth=2, depth_check=False)) == "reproduced"


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
    assert C.registered_verdict(res) == "reproduced"  # the failing check is informational only
    assert res["checks"][0]["check"] == "collapse [variant=pure]" and res["measured"] == pytest.approx(0.025)
    missing = C.evaluate_claim(table, {"id": "Y", "effect": "e", "rule": {"checks": [{"lhs": _q("skip")}]}})
    assert missing["verdict"] == "not run" and "variant=skip" in missing["missing"]


def test_override_reads_changed_setting(table):
    claim = {"id": "Z", "effect": "e", "rule": {"checks": [
        {"lhs": {"stat": "value", "metric": "mu_relative", "layer": 2, "select": {"variant": "sphere", "init_scale": 1.0}},
         "op": ">=", "factor": 1.5}]}}
    table = table.assign(init_scale=np.where(table["setting"] == "default", 1.0, 2.0))
    assert C.registered_verdict(C.evaluate_claim(table, claim)) == "not reproduced"
    near = C.evaluate_claim(table, claim, setting="init_scale=2", override={"init_scale": 2.0})
    assert C.registered_verdict(near) == "reproduced"


def test_window_override_rewrites_the_mask_spec():
    rule = {"checks": [{"lhs": {"select": {"mask_spec": "sliding_window:w=9"}}, "rhs": {"select": {"mask_spec": "causal"}}}]}
    out = C._override_rule(rule, {"window": 3})
    assert out["checks"][0]["lhs"]["select"]["mask_spec"] == "sliding_window:w=3"
    assert out["checks"][0]["rhs"]["select"]["mask_spec"] == "causal"


def test_bad_operator_raises(table):
    with pytest.raises(ConfigError, match="operator"):
        C.evaluate_check(table, {"lhs": _q("pure"), "op": "=="})


def test_configs_hold_the_claims_once():
    """The paper's twelve claims (C01-C12), the geometry experiment's five (G1-G5), the
    position-bias experiment's four (I1-I4), the temperature-law experiment's five (L1-L5), the
    power-method experiment's three (P1-P3), the energy experiment's two (E1-E2) and the sinks
    experiment's one (S1), each once."""
    ids = [c["id"] for n in EXPERIMENTS for c in load_config(n).get("claims", [])]
    assert sorted(ids) == sorted([f"C{k:02d}" for k in range(1, 13)] + [f"G{k}" for k in range(1, 6)]
                                 + [f"I{k}" for k in range(1, 5)] + ["L1", "L2", "L3", "L4", "L5", "P1", "P2", "P3", "E1", "E2", "S1"])
    for n in EXPERIMENTS:
        for claim in load_config(n).get("claims", []):
            paper = claim["id"].startswith("C")  # G-, I- and L-claims are this project's own
            own = {"G": "New", "I": "New", "L": "New (temperature laws)", "P": "New (power method)",
                   "E": "New (energy and contraction)", "S": "New (head-wise RMSNorm and the sink)"}.get(claim["id"][0])
            cites = "arXiv" in claim["paper_effect"]  # a claim of this project's that tests a paper's statement
            assert claim["effect"] and (claim["paper_effect"] in (("Helped", "Hurt", "Mixed") if paper else (own,)) or cites)
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


def test_c02_decides_at_matched_logit_scale_and_c11_compares_value_matrices():
    claims = {c["id"]: c for n in EXPERIMENTS for c in load_config(n).get("claims", [])}
    scored = lambda cid: [c for c in C.expand_checks(claims[cid]["rule"]["checks"]) if not c.get("informational")]  # noqa: E731
    # C02: the statement (rate of mu_rel at or above 1 - delta), for real LN and radius sqrt(d)
    # only: never the unit sphere, whose logits are ~98x smaller than pure SA's
    c02 = scored("C02")
    assert len(c02) == 8 and all(c["lhs"]["stat"] == "rate" and c["rhs"] == {"const": 1.0} for c in c02)
    assert {(c["lhs"]["select"]["variant"], c["lhs"]["select"]["sphere_radius"]) for c in c02} == {
        ("layernorm", 1.0), ("sphere", 19.595917942265423)}
    # C11: one difference of rates between W_V families, counted beyond a stated margin,
    # and no longer C02's number
    c11 = scored("C11")
    assert all(c["compare"] == "difference" and c["op"] == ">" and c["factor"] > 0 for c in c11)
    assert {c["lhs"]["select"]["variant"] for c in c11} == {"ln_example_basin"}
    assert {c["rhs"]["select"]["value"] for c in c11} == {"orthogonal"}
    assert claims["C11"]["rule"].get("expect", "all") == "all"
    # C09 decides at the logit scale of real LayerNorm too; the unit sphere is a reference
    assert all(c["lhs"]["select"].get("sphere_radius", 19.595917942265423) != 1.0 for c in scored("C09"))
    for cid in ("C02", "C09", "C11"):
        assert claims[cid]["original"]["earlier"], cid  # the amendment before this one is kept


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
    q = {"stat": "envelope_rate", "n_tokens": 4, "select": {"mask_spec": "complete"}}
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
             "lhs": {"stat": "envelope_rate", "n_tokens": 16, "select": {"mask_spec": "{mask}"}}, "op": "<", "rhs": {"const": 1.0}}]}}
    from rankcollapse.theory import envelope_rate

    res = C.evaluate_claim(pd.DataFrame(), claim, setting="window=3", override={"window": 3}, n_boot=10)
    assert res["checks"][0]["value"] == envelope_rate("sliding_window:w=3", n_tokens=16)


def test_change_from_a_layer_at_its_floor_is_a_lower_bound():
    t = _curve("complete", "pure", [1e-17, 0.5, 0.25])  # layer 0 below float64's eps
    v = C.quantity(t, {"stat": "change", "metric": "mu_relative", "layer": 2, "from": 0, "select": {"variant": "pure"}})
    assert v.bound == "lower"
    both = _curve("complete", "pure", [1e-17, 0.5, 1e-18])
    assert C.quantity(both, {"stat": "change", "metric": "mu_relative", "layer": 2, "from": 0,
                             "select": {"variant": "pure"}}).bound == "undecidable"


@pytest.mark.parametrize("outcomes, verdict", [
    (["fails", "undecided"], C.NOT_WHERE_DECIDABLE),
    (["fails", "undecidable", C.FACTOR_OFF_PASSES], C.NOT_WHERE_DECIDABLE),
    (["holds", "undecided"], "mixed"),
    (["holds", "fails", "undecided"], "mixed"),
])
def test_checks_that_fail_wherever_decidable_read_so(outcomes, verdict):
    assert C.verdict_from(outcomes) == verdict


def test_the_number_shown_is_a_deciding_checks_never_an_undecided_one():
    undecided = {"check": "u", "op": ">=", "threshold": 0.99, "interval": [0.98, 0.995], "outcome": "undecided"}
    failing = {"check": "f", "op": ">=", "threshold": 0.99, "interval": [0.2, 0.3], "outcome": "fails"}
    holding = {"check": "h", "op": ">=", "threshold": 0.99, "interval": [0.999, 1.0], "outcome": "holds"}
    assert C.decisive([undecided, failing], C.NOT_WHERE_DECIDABLE)["check"] == "f"
    assert C.decisive([undecided, failing], "mixed")["check"] == "f"
    assert C.decisive([undecided, holding], "mixed")["check"] == "h"


def _check(name, interval, tau=0.99, op=">=", ref=1.0, **extra):
    spec = {"lhs": {"stat": "rate"}, "rhs": {"const": 1.0}, "factor": tau}
    rec = {"check": name, "op": op, "threshold": tau, "interval": list(interval), "bound": None, **extra}
    rec["outcome"] = C.outcome_at(rec)
    return {**rec, "band": C.band_of(spec, tau), "band_stated": False, "reference": ref}


def test_default_band_is_half_to_twice_the_distance_from_no_effect():
    rate = {"lhs": {"stat": "rate"}, "rhs": {"const": 1.0}}
    assert C.band_of(rate, 0.99) == pytest.approx([0.98, 0.995])  # delta 0.01 -> 0.005 .. 0.02
    assert C.band_of({"lhs": {"stat": "change"}, "rhs": {"stat": "change"}}, 10.0) == [5.0, 20.0]
    assert C.band_of({"lhs": {"stat": "rate"}, "rhs": {"stat": "rate"}, "compare": "difference"}, 0.01) == [0.005, 0.02]
    assert C.band_of({"lhs": {"stat": "spearman"}, "rhs": {"const": 1.0}}, -0.5) == [-1.0, -0.25]
    assert C.band_of({"lhs": {"stat": "rate"}, "rhs": {"stat": "rate"}}, 1.0) is None  # a ratio against 1: no band
    assert C.band_of({**rate, "band": [0.97, 0.999]}, 0.99) == [0.97, 0.999]  # a stated band


def test_a_verdict_that_flips_inside_the_band_is_threshold_sensitive_with_its_flip_point():
    """C11's shape: two differences far above delta = 0.01, one whose interval [0.0061,
    0.0093] fails at 0.01 but holds at any delta below 0.0061."""
    scored = [_check("d [mask=a]", (0.75, 0.79), tau=0.01, op=">", ref=0.0),
              _check("d [mask=b]", (0.0061, 0.0093), tau=0.01, op=">", ref=0.0)]
    for s in scored:
        s["band"] = [0.005, 0.02]
    res = C.with_bands({"verdict": C.verdict_from([s["outcome"] for s in scored]), "checks": scored})
    (band,) = res["bands"]
    assert res["verdict"] == C.THRESHOLD_SENSITIVE and res["verdict_at_threshold"] == "mixed"
    assert band["band"] == [0.005, 0.02] and band["verdict_low"] == "reproduced" and band["verdict_high"] == "mixed"
    assert band["flip_point"] == pytest.approx(0.0061) and band["flips"] == [
        {"at": pytest.approx(0.0061), "below": "reproduced", "above": "mixed"}]
    assert len(band["grid"]) == 13 and band["grid"][0][0] == pytest.approx(0.005) and band["grid"][-1][0] == pytest.approx(0.02)
    # an interval far from every edge of its band: the verdict stands
    steady = C.with_bands({"verdict": "not reproduced", "checks": [_check("r", (0.2, 0.3))]})
    assert steady["verdict"] == "not reproduced" and steady["bands"][0]["sensitive"] is False


def test_a_check_whose_factor_off_arm_passes_as_well_carries_no_verdict():
    off = {"interval": [0.9919, 0.9944], "bound": None}
    both = _check("LN [mask=w9]", (0.9920, 0.9939), factor_off=off)
    assert both["outcome"] == C.FACTOR_OFF_PASSES  # holds, but pure SA without LN holds too
    assert _check("LN [mask=w9]", (0.9920, 0.9939))["outcome"] == "holds"
    assert _check("LN [mask=w9]", (0.9920, 0.9939), factor_off={"interval": [0.5, 0.6]})["outcome"] == "holds"
    failing = [_check(f"LN [mask={m}]", (0.2, 0.5), factor_off={"interval": [0.3, 0.6]}) for m in "abc"]
    assert C.verdict_from([c["outcome"] for c in failing + [both]]) == C.NOT_WHERE_DECIDABLE


def test_factor_contrast_on_a_table(table):
    """At layer 1 sphere reads 0.9 and 0.5 (two seeds), pure 0.1 and 0.2: with the factor
    (the sphere) off the check fails, so it carries the verdict; an arm without rows is
    recorded, not read."""
    check = {"name": "keeps", "lhs": _q("sphere", "value", 1), "op": ">=", "factor": 0.3}
    claim = {"id": "F", "effect": "e", "rule": {"checks": [check]},
             "factor": {"name": "sphere", "without": [{"where": {"variant": "sphere"}, "set": {"variant": "pure"}}]}}
    res = C.evaluate_claim(table, claim, n_boot=50)
    (k,) = res["checks"]
    assert k["outcome"] == "holds" and k["factor_off"]["value"] == pytest.approx(0.15)
    assert k["factor_off"]["outcome"] == "fails" and C.registered_verdict(res) == "reproduced"
    lax = {**claim, "rule": {"checks": [{**check, "factor": 0.05}]}}  # pure SA clears 0.05 as well
    assert C.evaluate_claim(table, lax, n_boot=50)["checks"][0]["outcome"] == C.FACTOR_OFF_PASSES
    absent = {**claim, "factor": {"name": "x", "without": [{"where": {"variant": "sphere"}, "set": {"variant": "skip"}}]}}
    (k,) = C.evaluate_claim(table, absent, n_boot=50)["checks"]
    assert k["outcome"] == "holds" and "no rows" in k["factor_off"]["missing"]


def test_each_condition_reads_the_floor_of_its_own_n_and_d():
    """2 (N + d) eps at the rows' own shape: N the run's (or a claim axis's label), d the
    model's width, a theory check's own (N, d); the conservative default where unknown."""
    from rankcollapse.experiments.quantities import MODEL_WIDTHS, row_floor
    from rankcollapse.metrics.floor import EPS64, mu_floor

    def rows(**labels):
        return pd.DataFrame([{"source": "simulate", "model": "minilm", "setting": "default", "variant": "pure",
                              "dtype": "float64", **labels}])

    assert row_floor(rows(), "mu_relative", 128) == 2 * (128 + 384) * EPS64
    assert row_floor(rows(setting="n_tokens=8192,positions=none"), "mu_relative", 128) == mu_floor(8192, 384)
    assert row_floor(rows(setting="window=3"), "sigma_ratio", 256) == mu_floor(256, 384)
    assert row_floor(rows(source="theory", model="theory", variant="ln_example_basin"), "mu_relative", 128) == 8 * EPS64
    assert row_floor(rows(dtype="float32"), "mu_relative", 128) == mu_floor(128, 384, "float32")
    assert row_floor(rows(), "mu", 128) == 0.0  # an absolute metric has no relative floor
    assert row_floor(rows(model="other"), "mu_relative", 128) == mu_floor(128, 576)  # d unknown: the default d
    assert row_floor(rows(), "mu_relative") == mu_floor(8192, 384)  # N unknown: the default N
    # a collapsed value between eps and the default floor is a measurement at N = 128, d = 384
    t = pd.concat([_curve("causal", "sphere", [1.0, 2.8e-9]), _curve("complete", "sphere", [1.0, 1e-12])],
                  ignore_index=True).assign(model="minilm")
    check = {"lhs": _q("sphere", mask="causal"), "op": ">=", "factor": 2, "rhs": _q("sphere", mask="complete")}
    ctx = EvalContext(n_tokens=128)
    res = C.evaluate_check(t, check, ctx=ctx)
    assert res["bound"] is None and res["value"] == pytest.approx(2800) and res["floors"] == [mu_floor(128, 384)] * 2
    assert C.evaluate_check(t, check)["bound"] == "lower"  # at the default N = 8,192 it is within the floor
    assert MODEL_WIDTHS["minilm"] == 384


def test_ratio_check_with_a_zero_denominator_is_inf_or_nan_never_an_error():
    # sink mass has no round-off floor: an exact 0 on the right is an upper bound of 0, so the
    # ratio is unbounded above (inf, undecided) or 0/0 (nan, undecidable), as a `ratio` quantity reads it
    t = pd.concat([rows_from_metrics({"sink_mass": np.array([[1.0] * 3, [a] * 3])},
                                     {"source": "simulate", "mask": "complete", "mask_spec": "complete", "variant": v,
                                      "seed": 0, "setting": "default", "dtype": "float64"})
                   for v, a in (("a", 0.5), ("zero", 0.0))], ignore_index=True)
    q = {"stat": "value", "metric": "sink_mass", "layer": "last"}
    check = {"lhs": {**q, "select": {"variant": "a"}}, "op": ">=", "factor": 2, "rhs": {**q, "select": {"variant": "zero"}}}
    res = C.evaluate_check(t, check)
    assert res["value"] == math.inf and res["bound"] == "lower" and res["outcome"] == "undecided"
    assert C.quantity(t, {"stat": "ratio", "num": check["lhs"], "den": check["rhs"]}).point == math.inf
    res = C.evaluate_check(t, {**check, "lhs": check["rhs"]})
    assert math.isnan(res["value"]) and res["outcome"] == "undecidable"
