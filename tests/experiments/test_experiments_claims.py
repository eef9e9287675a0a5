"""The claims rule engine on hand-built tables with known answers."""

import math

import numpy as np
import pandas as pd
import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import claims as C
from rankcollapse.experiments.config import EXPERIMENTS, load_config
from rankcollapse.experiments.table import COLUMNS, normalise, rows_from_metrics


def _curve(mask: str, variant: str, values: list[float], seed: int = 0, setting: str = "default") -> pd.DataFrame:
    vals = np.asarray(values, dtype=float)[:, None] * np.ones((1, 3))  # 3 identical windows
    return rows_from_metrics({"mu_relative": vals}, {"source": "simulate", "mask": mask, "variant": variant,
                                                     "seed": seed, "setting": setting})


@pytest.fixture
def table() -> pd.DataFrame:
    return pd.concat([
        _curve("complete", "pure", [1.0, 0.1, 0.01], seed=0),
        _curve("complete", "pure", [1.0, 0.2, 0.04], seed=1),
        _curve("complete", "ln", [1.0, 0.9, 0.8], seed=0),
        _curve("complete", "ln", [1.0, 0.5, 0.02], seed=1),
        _curve("complete", "ln", [2.0, 2.0, 2.0], seed=0, setting="init_scale=2"),
    ], ignore_index=True)


def _q(variant, stat="change", layer="last", mask="complete"):
    return {"stat": stat, "metric": "mu_relative", "layer": layer, "select": {"variant": variant, "mask": mask}}


def test_quantities_per_seed(table):
    assert C.quantity(table, _q("pure", "value", 1)).to_dict() == pytest.approx({0: 0.1, 1: 0.2})
    assert C.quantity(table, _q("pure")).to_dict() == pytest.approx({0: 0.01, 1: 0.04})
    assert C.quantity(table, {"stat": "min", "metric": "mu_relative", "select": {"variant": "ln"}}).to_dict() == pytest.approx({0: 0.8, 1: 0.02})
    ratio = C.quantity(table, {"stat": "ratio", "num": _q("ln"), "den": _q("pure")})
    assert ratio.to_dict() == pytest.approx({0: 80.0, 1: 0.5})
    assert C.quantity(table, {"const": 3}).to_dict() == {-1: 3.0}


def test_check_outcomes_and_verdicts(table):
    holds = C.evaluate_check(table, {"lhs": _q("pure"), "op": "<=", "factor": 0.05})
    assert holds["outcome"] == "holds" and holds["per_seed"][1] == [0.04, 1.0, True]
    fails = C.evaluate_check(table, {"lhs": _q("pure"), "op": ">=", "factor": 0.5})
    assert fails["outcome"] == "fails"
    split = C.evaluate_check(table, {"lhs": _q("ln"), "op": ">=", "factor": 10, "rhs": _q("pure")})
    assert split["outcome"] == "split"  # seed 0: 0.8 >= 0.1; seed 1: 0.02 < 0.4
    assert split["lhs"]["mean"] == pytest.approx(0.41)


@pytest.mark.parametrize("outcomes, expect, verdict", [
    (["holds", "holds"], "all", "reproduced"),
    (["fails", "fails"], "all", "not reproduced"),
    (["holds", "fails"], "all", "mixed"),
    (["split"], "all", "mixed"),
    (["holds", "fails"], "mixed", "reproduced"),
    (["holds", "holds"], "mixed", "not reproduced"),
    (["split", "split"], "mixed", "mixed"),
    ([], "all", "not run"),
])
def test_verdict_from(outcomes, expect, verdict):
    assert C.verdict_from(outcomes, expect) == verdict


def test_claim_for_each_informational_and_missing(table):
    claim = {"id": "X", "effect": "e", "rule": {"checks": [
        {"name": "collapse", "for_each": {"variant": ["pure"]}, "lhs": _q("{variant}"), "op": "<=", "factor": 0.05},
        {"name": "info", "informational": True, "lhs": _q("ln"), "op": ">=", "factor": 100},
    ]}}
    res = C.evaluate_claim(table, claim)
    assert res["verdict"] == "reproduced"  # the failing check is informational only
    assert res["measured"]["checks"][0]["check"] == "collapse [variant=pure]"
    missing = C.evaluate_claim(table, {"id": "Y", "effect": "e", "rule": {"checks": [{"lhs": _q("skip")}]}})
    assert missing["verdict"] == "not run" and "skip" in missing["missing"]


def test_override_reads_changed_setting(table):
    claim = {"id": "Z", "effect": "e", "rule": {"checks": [
        {"lhs": {"stat": "value", "metric": "mu_relative", "layer": 2, "select": {"variant": "ln", "init_scale": 1.0}},
         "op": ">=", "factor": 1.5}]}}
    table = table.assign(init_scale=np.where(table["setting"] == "default", 1.0, 2.0))
    assert C.evaluate_claim(table, claim)["verdict"] == "not reproduced"
    near = C.evaluate_claim(table, claim, setting="init_scale=2", override={"init_scale": 2.0})
    assert near["verdict"] == "reproduced"


def test_bad_operator_raises(table):
    with pytest.raises(ConfigError, match="operator"):
        C.evaluate_check(table, {"lhs": _q("pure"), "op": "=="})


def test_configs_hold_the_twelve_claims_once():
    ids = [c["id"] for n in EXPERIMENTS for c in load_config(n).get("claims", [])]
    assert sorted(ids) == [f"C{k:02d}" for k in range(1, 13)]
    for n in EXPERIMENTS:
        for claim in load_config(n).get("claims", []):
            assert claim["effect"] and claim["paper_effect"] in ("Helped", "Hurt", "Mixed")
            for check in C.expand_checks(claim["rule"]["checks"]):
                for side in ("lhs", "rhs"):
                    _assert_columns(check.get(side, {"const": 1}))


def _assert_columns(q):
    if "const" in q:
        return
    if q.get("stat") == "ratio":
        _assert_columns(q["num"]), _assert_columns(q["den"])
        return
    assert set(q.get("select", {})) <= set(COLUMNS), q


def test_normalise_fills_columns():
    df = normalise(pd.DataFrame({"layer": [0], "metric": ["mu"], "mean": [1.0]}), {"model": "m"})
    assert list(df.columns) == list(COLUMNS)
    assert df.loc[0, "seed"] == -1 and df.loc[0, "setting"] == "default" and math.isnan(df.loc[0, "q25"])


def test_floor_makes_two_collapsed_values_equal():
    t = pd.concat([_curve("complete", "pure", [1.0, 1e-8, 3e-16]), _curve("complete", "ln", [1.0, 1e-9, 1e-14])],
                  ignore_index=True)
    check = {"lhs": _q("ln"), "op": ">=", "factor": 10, "rhs": _q("pure")}
    assert C.evaluate_check(t, check)["outcome"] == "holds"  # 1e-14 >= 10 x 3e-16: rounding noise decides
    assert C.evaluate_check(t, {**check, "floor": 1e-12})["outcome"] == "fails"  # both collapsed: no effect
    assert C.evaluate_check(t, {**check, "lhs": _q("pure", "value", 0), "floor": 1e-12})["outcome"] == "holds"


def test_min_from_layer_and_final_norm_left_out():
    vals = np.array([[0.6], [1.0], [1.0], [0.2]])
    t = rows_from_metrics({"rank_fraction": vals}, {"source": "probe", "model": "m", "variant": "full"},
                          layers=[0, 1, 2, 2], points=["embeddings", "layer.0.output", "layer.1.output", "final_norm"])
    q = {"stat": "min", "metric": "rank_fraction", "select": {"model": "m"}}
    assert C.quantity(t, q).to_dict() == {-1: 0.6}
    assert C.quantity(t, {**q, "from_layer": 1}).to_dict() == {-1: 1.0}  # final_norm (0.2) not averaged in
    assert C.quantity(t, {**q, "select": {"model": "m", "point": "final_norm"}}).to_dict() == {-1: 0.2}


def test_c02_and_c11_read_one_comparison():
    fig2 = {c["id"]: c for c in load_config("fig2")["claims"]}
    c02, c11 = (C.expand_checks(fig2[k]["rule"]["checks"]) for k in ("C02", "C11"))
    scored = [c for c in c11 if not c.get("informational")]
    assert [(c["lhs"], c["rhs"], c["factor"], c["floor"]) for c in scored] == \
        [(c["lhs"], c["rhs"], c["factor"], c["floor"]) for c in c02]
    assert fig2["C11"]["rule"]["expect"] == "mixed" and fig2["C02"]["rule"].get("expect", "all") == "all"
