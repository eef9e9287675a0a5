"""No committed magnitude rests on round-off: a decisive number of docs/results/*/claims.json
that is printed as a measurement (no ``bound``) has no side within the round-off floor
model of its compute dtype (rankcollapse.metrics.floor.relative_floor); in the runs decided
again from a committed table, no check does."""

import json
from pathlib import Path

import pytest

from rankcollapse.metrics.floor import relative_floor

RESULTS = Path(__file__).parents[2] / "docs" / "results"
RUNS = sorted(p.parent for p in RESULTS.glob("*/claims.json"))


def _at_floor(check):
    """Sides of a check with a floor (a relative metric) whose mean is within the model."""
    out = []
    for name, floor in zip(("lhs", "rhs"), check.get("floors") or (0.0, 0.0)):
        side = check.get(name) or {}
        if floor and side.get("mean") is not None and side["mean"] <= relative_floor(side.get("dtype") or "float64"):
            out.append(name)
    return out


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_no_committed_magnitude_has_a_side_within_the_floor(run):
    bad = []
    for claim in json.loads((run / "claims.json").read_text()):
        for check in claim["checks"]:
            decisive = check["check"] == claim.get("decisive")
            if (decisive or (run / "table.parquet").is_file()) and check.get("bound") is None and _at_floor(check):
                bad.append(f"{claim['id']}: {check['check']} = {check.get('value')} ({_at_floor(check)} at round-off)")
    assert not bad, "\n".join(bad)


def test_the_committed_quick_run_reads_a_ratio_to_round_off_as_a_bound():
    """C01's bidirectional check divides by the complete mask's mu/||X||_F at round-off (a
    few eps: above eps, within the model): a lower bound, not a magnitude."""
    claims = {c["id"]: c for c in json.loads((RESULTS / "quick" / "claims.json").read_text())}
    (check,) = [k for k in claims["C01"]["checks"] if k["check"] == "bidirectional window vs complete"]
    assert check["bound"] == "lower" and check["rhs"]["bound"] == "upper" and check["rhs"]["collapsed"]
    assert check["rhs"]["floor"] == relative_floor("float64") and check["lhs"]["bound"] is None
