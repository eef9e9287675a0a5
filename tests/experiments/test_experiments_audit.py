"""The decision layer on committed runs: C02's factor contrast, and `reproduce audit`
(factor contrast, threshold bands, bounds) read from committed outputs without
recomputing a unit."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rankcollapse import cli
from rankcollapse.experiments import audit as A
from rankcollapse.experiments import claims as C
from rankcollapse.experiments.config import load_config
from rankcollapse.experiments.quantities import EvalContext
from rankcollapse.experiments.table import normalise

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
C02 = next(c for c in load_config("fig2")["claims"] if c["id"] == "C02")
W9 = "real LayerNorm: per-layer rate >= 1 - δ [mask=sliding_window:w=9]"


def test_c02_factor_off_arm_is_pure_sa_without_layernorm_under_the_same_mask():
    on = {c["name"]: c for c in C.expand_checks(C02["rule"]["checks"])}
    off = {c["name"]: c for c in C.factor_off_rule(C02["rule"], C02["factor"])["checks"]}
    sel_on, sel_off = on[W9]["lhs"]["select"], off[W9]["lhs"]["select"]
    assert sel_on["variant"] == "layernorm" and sel_off["variant"] == "pure" and "norm" not in sel_off
    # same mask, weights, inputs, depth, seeds; the logit scale of real LayerNorm: d_qk = (100.8 / 384)^2
    assert sel_on["d_qk"] == 1.0 and sel_off["d_qk"] == 0.06890625
    assert {k: v for k, v in sel_off.items() if k not in ("variant", "d_qk")} == {
        k: v for k, v in sel_on.items() if k not in ("variant", "norm", "d_qk")}
    assert (off[W9]["op"], off[W9]["factor"], off[W9]["rhs"]) == (on[W9]["op"], on[W9]["factor"], on[W9]["rhs"])


def test_c02_window_check_cannot_carry_the_verdict_on_the_committed_quick_table():
    """C02's rule run on the pure-SA-without-LayerNorm arm of the committed quick table:
    wherever in the band the window check holds with LayerNorm, it holds without."""
    table = normalise(pd.read_parquet(RESULTS / "quick" / "table.parquet"))
    check = next(c for c in C.expand_checks(C02["rule"]["checks"]) if c["name"] == W9)
    off = next(c for c in C.factor_off_rule(C02["rule"], C02["factor"])["checks"] if c["name"] == W9)
    ctx = EvalContext(depth=32, seed=sum(map(ord, "C02")))
    rec = {**C.evaluate_check(table, check, ctx=ctx), "factor_off": C.evaluate_check(table, off, ctx=ctx)}
    assert rec["factor_off"]["value"] > 0.98  # pure SA under the w = 9 window barely collapses either
    holds = [t for t in np.linspace(0.98, 0.995, 61) if C._outcome(">=", *rec["interval"], t) == "holds"]
    assert holds and all(C.outcome_at(rec, t) == C.FACTOR_OFF_PASSES for t in holds)


def test_c02_at_large_scale_is_decided_on_its_matched_contrast():
    """The large run has pure SA at the logit scale of real LayerNorm for every check: under
    the w = 9 window both arms clear 1 - δ, so that check carries no verdict; every other
    check fails, and the verdict at the registered δ is "not reproduced where decidable"."""
    rec = next(c for c in json.loads((RESULTS / "large" / "claims.json").read_text()) if c["id"] == "C02")
    config = json.loads((RESULTS / "large" / "config.json").read_text())
    now = A.redecide(rec, A.run_rules(config)["C02"])
    scored = [k for k in now["checks"] if not k.get("informational")]
    assert len(scored) == 8 and not any(k["factor_off"].get("missing") for k in scored)
    assert all("d_qk=0.06890625" in k["factor_off"]["text"] for k in scored)
    both = [k["check"] for k in scored if k["outcome"] == C.FACTOR_OFF_PASSES]
    assert len(both) == 2 and all("mask=sliding_window:w=9]" in k for k in both)
    assert all(k["outcome"] == "fails" for k in scored if k["check"] not in both)
    assert rec["verdict_at_threshold"] == "not reproduced where decidable" and rec["verdict"] == "threshold-sensitive"


def _cli(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["rankcollapse", "reproduce", "audit", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_audit_of_the_committed_quick_run(monkeypatch, capsys):
    code, out, _ = _cli(monkeypatch, capsys, str(RESULTS / "quick"), "--format", "json")
    assert code == 0
    entries = {e["id"]: e for e in json.loads(out)}
    stored = {c["id"]: c for c in json.loads((RESULTS / "quick" / "claims.json").read_text())}
    assert set(entries) == set(stored)
    c11 = entries["C11"]  # the window difference 0.0061-0.0093 against delta = 0.01
    (band,) = c11["bands"]
    assert band["band"] == pytest.approx([0.005, 0.02]) and band["verdict_low"] == "reproduced"
    assert c11["verdict"] == C.THRESHOLD_SENSITIVE and 0.005 < band["flip_point"] < 0.01
    assert {c["check"] for c in entries["C02"]["contrast"]} == {
        k["check"] for k in stored["C02"]["checks"] if not k.get("informational")}
    assert all(c["off"] is not None for c in entries["C02"]["contrast"])
    # C01's complete-mask denominator sits a few epsilon above float64's floor
    assert any("within 100 x its floor" in n for b in entries["C01"]["bounds"] for n in b["near_floor"])
    code, out, _ = _cli(monkeypatch, capsys, str(RESULTS / "quick"))
    assert code == 0 and out.startswith("| id | verdict |") and "| C02 |" in out and "- factor LayerNorm:" in out


def test_audit_of_a_committed_run_without_a_table_says_so_in_one_line(monkeypatch, capsys):
    assert not any((RESULTS / "large" / n).exists() for n in ("table.parquet", "table.csv"))
    code, out, err = _cli(monkeypatch, capsys, str(RESULTS / "large"))
    assert code == 0 and out.startswith("| id | verdict |") and "| C02 |" in out
    assert err.strip().splitlines() == [f"note: {RESULTS / 'large'} keeps no table: the audit reads the checks "
                                        "stored in its claims.json (no quantity is read again from rows)"]


def test_audit_refuses_a_folder_that_is_not_a_run(monkeypatch, capsys, tmp_path):
    code, _, err = _cli(monkeypatch, capsys, str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not a finished run folder" in err


def _equal_to_round_off(a, b, rel: float = 1e-12) -> bool:
    """``a == b`` for JSON values, floats to ``rel`` (the band grids are powers and logs, whose
    last bit depends on the CPU's vector math), NaN equal to NaN."""
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool)
                and (math.isclose(a, b, rel_tol=rel, abs_tol=0.0) or math.isnan(a) and math.isnan(b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal_to_round_off(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal_to_round_off(x, y, rel) for x, y in zip(a, b))
    return a == b


def test_equal_to_round_off_tells_round_off_from_a_change():
    assert _equal_to_round_off({"g": [[-0.5345392308842035, "x"]], "n": 3}, {"g": [[-0.5345392308842036, "x"]], "n": 3})
    assert not _equal_to_round_off({"g": [[0.5345392308842035]]}, {"g": [[0.53453923088]]})
    assert not _equal_to_round_off({"v": "holds"}, {"v": "fails"}) and not _equal_to_round_off([1.0], [1.0, 2.0])
    assert _equal_to_round_off([float("nan")], [float("nan")]) and not _equal_to_round_off([True], [1.0])


def test_committed_geometry_claims_are_todays_decision_of_their_table(tmp_path):
    """docs/results/geometry-quick's claims.json is what today's decision layer makes of
    its committed table (no unit recomputed): bands, labels and numbers included."""
    from rankcollapse._io import write_json_atomic
    from rankcollapse.experiments import runner

    stored = json.loads((RESULTS / "geometry-quick" / "claims.json").read_text())
    write_json_atomic(tmp_path / "claims.json", runner.decide_again(RESULTS / "geometry-quick"))  # as a run writes it
    again = json.loads((tmp_path / "claims.json").read_text())
    assert _equal_to_round_off(again, stored)
    g1 = next(c for c in again if c["id"] == "G1")
    where = next(b for b in g1["bands"] if "where max_norm_ratio" in b["threshold"])
    assert [round(f["at"], 1) for f in where["flips"]] == [9.6, 12.2]  # the two layers either side of 10
