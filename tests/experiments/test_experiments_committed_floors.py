"""No committed magnitude rests on round-off: a decisive number of docs/results/*/claims.json
that is printed as a measurement (no ``bound``) has no side within the round-off floor of
its own rows (the error model 2 (N + d) eps at the rows' N and d,
rankcollapse.experiments.quantities.row_floor); in the runs decided again from a committed
table, no check does."""

import json
from pathlib import Path

import pytest

from rankcollapse.metrics.floor import mu_floor, relative_floor

RESULTS = Path(__file__).parents[2] / "docs" / "results"
RUNS = sorted(p.parent for p in RESULTS.glob("*/claims.json"))
#: Runs decided again from their committed table (a table.csv has no per-window values).
TABLES = [r for r in RUNS if (r / "table.parquet").is_file()]


def _at_floor(check):
    """Sides of a check with a floor (a relative metric) whose mean is within it."""
    out = []
    for name, floor in zip(("lhs", "rhs"), check.get("floors") or (0.0, 0.0)):
        side = check.get(name) or {}
        if floor and side.get("mean") is not None and side["mean"] <= floor:
            out.append(name)
    return out


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_no_committed_magnitude_has_a_side_within_its_rows_floor(run):
    bad = []
    for claim in json.loads((run / "claims.json").read_text()):
        for check in claim["checks"]:
            decisive = check["check"] == claim.get("decisive")
            if (decisive or run in TABLES) and check.get("bound") is None and _at_floor(check):
                bad.append(f"{claim['id']}: {check['check']} = {check.get('value')} ({_at_floor(check)} at round-off)")
    assert not bad, "\n".join(bad)


def _stated_floors(obj):
    """The ``floor`` a rule states for a quantity of an absolute metric (theory μ)."""
    if isinstance(obj, dict):
        if isinstance(obj.get("floor"), (int, float)) and "metric" in obj:
            yield float(obj["floor"])
        for v in obj.values():
            yield from _stated_floors(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _stated_floors(v)


@pytest.mark.parametrize("run", TABLES, ids=lambda p: p.name)
def test_each_committed_side_reads_the_floor_of_its_own_n_and_d(run):
    """The floor a decided side stores is 2 (N + d) eps of its dtype at a shape the run has:
    the run's N or a claim axis's, and the width of MiniLM (384), SmolLM2 (576) or the
    N = d = 2 theory example; never the conservative default (N = 8,192 with d = 576)."""
    config = json.loads((run / "config.json").read_text())
    ns = {int(config["data"]["n_tokens"]), 128, 1024, 8192}
    allowed = {mu_floor(n, d, t) for n in ns for d in (384, 576) for t in ("float32", "float64")}
    allowed |= {mu_floor(2, 2), 0.0} | set(_stated_floors(config["configs"]))  # a rule's own floor (absolute μ)
    seen = set()
    for claim in json.loads((run / "claims.json").read_text()):
        for check in claim["checks"]:
            for name, floor in zip(("lhs", "rhs"), check.get("floors") or ()):
                if floor and (check.get(name) or {}).get("dtype"):
                    seen.add(floor)
                    assert floor in allowed and floor != relative_floor("float64"), (claim["id"], check["check"], floor)
    if run.name == "quick":
        assert mu_floor(128, 384) in seen and mu_floor(2, 2) in seen


def test_the_committed_quick_run_reads_a_ratio_to_round_off_as_a_bound():
    """C01's bidirectional check divides by the complete mask's mu/||X||_F at round-off (a
    few eps: within the floor 2 (128 + 384) eps of its rows): a lower bound, not a magnitude."""
    claims = {c["id"]: c for c in json.loads((RESULTS / "quick" / "claims.json").read_text())}
    (check,) = [k for k in claims["C01"]["checks"] if k["check"] == "bidirectional window vs complete"]
    assert check["bound"] == "lower" and check["rhs"]["bound"] == "upper" and check["rhs"]["collapsed"]
    assert check["rhs"]["floor"] == mu_floor(128, 384) and check["lhs"]["bound"] is None
