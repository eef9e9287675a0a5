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
    assert len(CLAIMS) == 20
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
    claims = [c for d in (RESULTS, GEOMETRY, INFLUENCE) for c in json.loads((d / "claims.json").read_text())]
    assert len(claims) == 20
    for c in claims:
        ctl = c["controls"]
        assert ctl["positive"]["verdict"] == "reproduced", (c["id"], ctl["positive"])
        assert ctl["negative"]["verdict"] in ("not reproduced", C.NOT_WHERE_DECIDABLE), (c["id"], ctl["negative"])
        assert ctl["negative"]["passed"] is True
        assert c["controls_ok"] is True


@pytest.mark.slow
def test_controls_recompute_from_the_committed_table():
    tables = {d: pd.read_parquet(d / "table.parquet") for d in (RESULTS, GEOMETRY, INFLUENCE)}
    stored = {c["id"]: (d, c) for d in tables for c in json.loads((d / "claims.json").read_text())}
    for cid, claim in CLAIMS.items():
        where, kept = stored[cid]
        again = evaluate_controls(tables[where], claim, depth=kept["depth"])
        assert again["positive"]["verdict"] == kept["controls"]["positive"]["verdict"]
        assert again["negative"]["verdict"] == kept["controls"]["negative"]["verdict"]
