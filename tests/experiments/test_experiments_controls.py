"""Positive and negative controls: the edits that redirect a rule, their reading on
hand-built rows, every claim having both, and the committed quick run, where every
control went through the real pipeline (real units, selection, floors and rule)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import claims as C
from rankcollapse.experiments.config import EXPERIMENTS, load_config
from rankcollapse.experiments.controls import control_rule, evaluate_controls
from rankcollapse.experiments.table import rows_from_metrics

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "quick"
GEOMETRY = RESULTS.parent / "geometry-quick"  # `all`'s geometry claims, committed apart (docs/results.md)
INFLUENCE = RESULTS.parent / "influence-quick"  # `all`'s position-bias claims, committed apart (docs/results.md)
LAWS = RESULTS.parent / "laws-quick"  # `all`'s temperature-law claims, committed apart (docs/results.md)
POWER = RESULTS.parent / "power-quick"  # `all`'s power-method claims, committed apart (docs/results.md)
ENERGY = RESULTS.parent / "energy-quick"  # `all`'s energy claims, committed apart (docs/results.md)
SINKS = RESULTS.parent / "sinks-quick"  # `all`'s head-wise RMSNorm claim, committed apart (docs/results.md)
CLAIMS = {c["id"]: c for n in EXPERIMENTS for c in load_config(n).get("claims", [])}


def _curve(mask, values, **labels):
    vals = np.asarray(values, dtype=float)[:, None] * np.array([[1.0, 1.01, 1.02]])
    return rows_from_metrics({"mu_relative": vals}, {"source": "simulate", "mask": mask.split(":")[0], "mask_spec": mask,
                                                     "variant": "pure", "dtype": "float64", **labels})


def _q(mask):
    return {"stat": "change", "metric": "mu_relative", "layer": 2, "select": {"variant": "pure", "mask_spec": mask}}


CLAIM = {"id": "T", "effect": "window slows collapse", "rule": {"checks": [
    {"for_each": {"mask": ["sliding_window:w=9"]}, "lhs": _q("{mask}"), "op": ">=", "factor": 2, "rhs": _q("complete")}]},
    "controls": {
        "positive": {"why": "w=3", "edits": [{"replace": {"mask_spec": {"sliding_window:w=9": "sliding_window:w=3"}}}]},
        "negative": {"why": "same both sides", "edits": [{"replace": {"mask_spec": {"sliding_window:w=9": "complete"}}}]}}}


def test_edits_redirect_selections():
    rule = control_rule(CLAIM["rule"], CLAIM["controls"]["positive"])
    assert rule["checks"][0]["lhs"]["select"]["mask_spec"] == "sliding_window:w=3"  # for_each unrolled first
    assert rule["checks"][0]["rhs"]["select"]["mask_spec"] == "complete"
    edit = {"edits": [{"where": {"mask_spec": "complete"}, "side": "rhs", "set": {"source": "theory"},
                       "drop": ["variant"], "quantity": {"layer": 0}}]}
    rhs = control_rule(CLAIM["rule"], edit)["checks"][0]["rhs"]
    assert rhs["select"] == {"mask_spec": "complete", "source": "theory"} and rhs["layer"] == 0
    ratio = {"checks": [{"lhs": {"stat": "ratio", "num": _q("complete"), "den": _q("causal")}, "op": ">"}]}
    out = control_rule(ratio, {"edits": [{"replace": {"mask_spec": {"causal": "complete"}}}]})
    assert out["checks"][0]["lhs"]["den"]["select"]["mask_spec"] == "complete"  # inside num/den too
    with pytest.raises(ConfigError, match="unknown keys"):
        control_rule(CLAIM["rule"], {"edits": [{"sett": {}}]})


def test_controls_read_through_the_rule():
    t = pd.concat([_curve("complete", [1.0, 0.1, 0.01]), _curve("sliding_window:w=9", [1.0, 0.9, 0.8]),
                   _curve("sliding_window:w=3", [1.0, 0.95, 0.9])], ignore_index=True)
    res = evaluate_controls(t, CLAIM, n_boot=100)
    assert res["positive"]["verdict"] == "reproduced" and res["negative"]["verdict"] == "not reproduced"
    assert res["negative"]["measured"] == 1.0 and res["ok"] is True
    # a rule that cannot fail: its negative control says so
    lax = {**CLAIM, "rule": {"checks": [{**CLAIM["rule"]["checks"][0], "factor": 0.5}]}}
    bad = evaluate_controls(t, lax, n_boot=100)
    assert bad["ok"] is False and bad["negative"]["verdict"] == "reproduced"
    rec = C.claim_record(lax, "x", C.evaluate_claim(t, lax, n_boot=100), controls=bad)
    assert rec["controls_ok"] is False and "Controls failed: negative control reads reproduced" in rec["notes"]
    # rows of a control missing from the run: not run, and ok is None
    missing = evaluate_controls(t[t["mask_spec"] != "sliding_window:w=3"], CLAIM, n_boot=20)
    assert missing["positive"]["verdict"] == "not run" and missing["ok"] is None


def test_every_claim_has_a_positive_and_a_negative_control():
    assert len(CLAIMS) == 32
    for cid, claim in CLAIMS.items():
        ctl = claim.get("controls")
        assert ctl and ctl["positive"]["why"].strip() and ctl["negative"]["why"].strip(), cid
        for kind in ("positive", "negative"):
            control_rule(claim["rule"], ctl[kind])  # every edit is well formed


def test_committed_quick_run_controls_pass_through_the_real_pipeline():
    """The positive control of every claim reads reproduced and the negative not
    reproduced (or not reproduced where decidable: a full mask against itself compares
    round-off with round-off), on the rows of the committed quick run (the same units, selections,
    floors and rules as the claims; tests/experiments/test_experiments_results_doc.py ties
    that run to today's configs)."""
    claims = [c for d in (RESULTS, GEOMETRY, INFLUENCE, LAWS, POWER, ENERGY, SINKS)
              for c in json.loads((d / "claims.json").read_text())]
    assert len(claims) == 38  # the quick run's 18 (C06, C07 with their N axis), 5 geometry, 4 position bias, 5 laws, 3 power, 2 energy, 1 sinks
    for c in claims:
        ctl = c["controls"]
        assert ctl["positive"]["verdict"] == "reproduced", (c["id"], ctl["positive"])
        assert ctl["negative"]["verdict"] in ("not reproduced", C.NOT_WHERE_DECIDABLE), (c["id"], ctl["negative"])
        assert ctl["negative"]["passed"] is True
        assert c["controls_ok"] is True


@pytest.mark.slow
def test_controls_recompute_from_the_committed_table():
    tables = {d: pd.read_parquet(d / "table.parquet") for d in (RESULTS, GEOMETRY, INFLUENCE, LAWS, POWER, ENERGY, SINKS)}
    stored = {c["id"]: (d, c) for d in tables for c in json.loads((d / "claims.json").read_text())}
    for cid, claim in CLAIMS.items():
        where, kept = stored[cid]
        again = evaluate_controls(tables[where], claim, depth=kept["depth"])
        assert again["positive"]["verdict"] == kept["controls"]["positive"]["verdict"]
        assert again["negative"]["verdict"] == kept["controls"]["negative"]["verdict"]


# ------------------------------------------------------------------ power and near-threshold controls
def _record(value, interval, op, threshold, band=None, text="x", statistic="value", reference=0.0, bound=None):
    return {"check": "c", "text": text, "statistic": statistic, "value": value, "interval": list(interval), "op": op,
            "threshold": threshold, "band": band, "reference": reference, "bound": bound, "outcome": "holds",
            "informational": False}


def test_power_flags_a_rank_correlation_of_noise_that_cannot_fail():
    """G4's former control: Spearman of a flat curve, 0.243 [-0.068, 0.346] against < 0.3
    (band 0.15 to 0.6). Carried to the failing end of the band (0.6) its interval still
    reaches below 0.3, so the check cannot fail on its own noise."""
    from rankcollapse.experiments.controls import power

    p = power(_record(0.243, (-0.068, 0.346), "<", 0.3, band=[0.15, 0.6], text="spearman(sink_mass, layer)"))
    assert p["reading"] == "cannot fail" and p["holds_there"] and not p["fails_there"]
    assert p["noise"] == pytest.approx([0.311, 0.103])
    # the equivalence check that replaced it: a noise of 0.001 against a margin of 0.01
    eq = power(_record(0.036, (0.0358, 0.0371), "<=", 0.044907, band=[0.039907, 0.054907]))
    assert eq["reading"] == "can pass and fail" and eq["pass_at"] == 0.039907 and eq["fail_at"] == 0.054907


def test_power_of_bounds_ratios_and_unbanded_thresholds():
    from rankcollapse.experiments.controls import NOT_ASSESSED, power

    # a lower bound (one side at its floor) can clear >= but never fail it
    assert power(_record(50.0, (40.0, 60.0), ">=", 10.0, band=[5.0, 20.0], bound="lower"))["reading"] == "cannot fail"
    # a ratio's noise is relative: 100 [50, 200] carried to 20 is [10, 40] (holds >= 10), to 5 is [2.5, 10] (fails)
    p = power(_record(100.0, (50.0, 200.0), ">=", 10.0, band=[5.0, 20.0]))
    assert p["reading"] == "cannot fail"  # [2.5, 10] touches 10: not wholly below
    p = power(_record(100.0, (60.0, 150.0), ">=", 10.0, band=[5.0, 20.0]))
    assert p["reading"] == "can pass and fail"
    # a ratio against 1 with no band: no registered effect size
    assert power(_record(1.5, (1.2, 1.8), ">", 1.0, statistic="ratio"))["reading"] == NOT_ASSESSED
    assert power({**_record(1.0, (1.0, 1.0), ">", 1.0), "informational": True}) is None


def test_near_threshold_controls_pass_one_side_and_fail_the_other():
    from rankcollapse.experiments.controls import near_threshold

    checks = [_record(-0.99, (-0.995, -0.98), "<=", -0.8, band=[-1.0, -0.4], text="spearman(a, b)"),
              _record(0.99, (0.9, 0.995), ">", -0.3, band=[-0.6, -0.15], text="spearman(b, a)")]
    checks[1]["check"] = "d"
    near = near_threshold(checks)
    assert [n["ok"] for n in near] == [True, True]
    assert near[0]["outcome_inside"] == "holds" and near[0]["outcome_outside"] == "fails"
    assert near[0]["verdict_inside"] == "reproduced" and near[0]["verdict_outside"] == "mixed"
    assert near[0]["just_inside"] < -0.8 < near[0]["just_outside"]
    # a rule that cannot pass: a rank correlation above 1, a factor below 1 under `within`
    assert not near_threshold([_record(0.5, (0.4, 0.6), ">=", 1.2, text="spearman(a, b)")])[0]["ok"]
    assert not near_threshold([_record(1.0, (1.0, 1.0), "within", 0.8)])[0]["ok"]


def test_every_committed_rule_passes_its_near_threshold_controls_and_records_power():
    """Every claim of every committed run decided again: each threshold's near control
    reads as it must; the records carry power and near_threshold."""
    for run in ("quick", "geometry-quick", "geometry-large", "influence-quick", "fig3-n-axis"):
        for rec in json.loads((RESULTS.parent / run / "claims.json").read_text()):
            if rec["verdict"] == "not run":
                continue
            assert rec["near_threshold"] and all(n["ok"] for n in rec["near_threshold"]), (run, rec["id"])
            assert "power" in rec and rec["power_ok"] in (True, False)


def test_g2_control_is_one_sided_and_g4_control_an_equivalence_test():
    """G2's random-init ρ = +0.99 (the opposite sign of the trained -0.996) passes its
    one-sided control; G4's random-init first-token mass stays within ±0.01 of the
    uniform value (1/127) Σ_{i=2..128} 1/i at every layer."""
    uniform = sum(1 / i for i in range(2, 129)) / 127
    assert uniform == pytest.approx(0.034907, abs=5e-7)
    g4 = {c["name"]: c for c in CLAIMS["G4"]["rule"]["checks"]}
    up = g4["SmolLM2 random-init: largest layer mean of sink_mass <= uniform + 0.01"]
    lo = g4["SmolLM2 random-init: smallest layer mean of sink_mass >= uniform - 0.01"]
    assert up["rhs"]["const"] == pytest.approx(uniform + 0.01, abs=5e-7)
    assert lo["rhs"]["const"] == pytest.approx(uniform - 0.01, abs=5e-7)
    for run in (GEOMETRY, GEOMETRY.parent / "geometry-large"):
        recs = {r["id"]: r for r in json.loads((run / "claims.json").read_text())}
        g2 = {k["check"]: k for k in recs["G2"]["checks"]}
        ctl = g2["SmolLM2 random-init: ρ > -0.3"]
        assert ctl["value"] > 0.9 and ctl["outcome"] == "holds" and ctl["null_hypothesis"]
        assert recs["G2"]["verdict_at_threshold"] == "reproduced"
        g4c = [k for k in recs["G4"]["checks"] if k["check"].startswith("SmolLM2 random-init")]
        assert len(g4c) == 2 and {k["outcome"] for k in g4c} == {"holds"}
        assert all(abs(k["value"] - uniform) < 0.002 for k in g4c)
        assert recs["G4"]["verdict"] == "reproduced"


def test_amended_claims_are_read_with_todays_rule():
    """A committed run (geometry-large) stored G2 with its two-sided control; today's G2
    (amended, with an `original` block) replaces it when the run is decided again, while
    an unamended claim keeps the run's rule."""
    from rankcollapse.experiments.audit import run_rules

    config = json.loads((GEOMETRY.parent / "geometry-large" / "config.json").read_text())
    stored = {c["id"]: c for cfg in config["configs"] for c in cfg["claims"]}
    assert any("ρ < 0.3" in c["name"] for c in stored["G2"]["rule"]["checks"])
    rules = run_rules(config)
    assert not any("ρ < 0.3" in c.get("name", "") for c in rules["G2"]["rule"]["checks"])
    assert rules["G3"]["rule"] == stored["G3"]["rule"]
