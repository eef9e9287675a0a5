"""docs/results.md's results table is the output of `reproduce summary` on the quick run
committed under ``docs/results/quick`` (claims.json, config.json), and that run is the
one today's code and configs would make: its unit hashes (config, numerics version, and
the library versions it recorded) equal the ones :func:`runner.plan` gives now, and its stored table
rechecks to the same verdicts. A change to a rule, a config or the numerics therefore
fails this test until the run is redone (``rankcollapse reproduce all --scale quick
--out docs/results/quick``) and the table in docs/results.md pasted from ``rankcollapse
reproduce summary docs/results/quick``; likewise for the other committed runs and their tables.

The table sits between the markers ``<!-- claims:start -->`` and ``<!-- claims:end -->``;
missing markers fail the test."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from rankcollapse.experiments import runner
from rankcollapse.experiments.report import results_markdown

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DOC = ROOT / "docs" / "results.md"
RESULTS = ROOT / "docs" / "results" / "quick"
GEOMETRY = ROOT / "docs" / "results" / "geometry-quick"
INFLUENCE = ROOT / "docs" / "results" / "influence-quick"
AXIS = ROOT / "docs" / "results" / "fig3-n-axis"
LAWS = ROOT / "docs" / "results" / "laws-quick"
POWER = ROOT / "docs" / "results" / "power-quick"
ENERGY = ROOT / "docs" / "results" / "energy-quick"
SINKS = ROOT / "docs" / "results" / "sinks-quick"


def doc_table(text: str, name: str = "claims") -> str:
    """The text between the ``<!-- {name}:start/end -->`` markers (stripped), or AssertionError."""
    m = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", text, flags=re.S)
    assert m, f"docs/results.md has no <!-- {name}:start --> ... <!-- {name}:end --> block"
    return m.group(1).strip()


def test_marker_extraction():
    assert doc_table("x\n<!-- claims:start -->\n| a |\n<!-- claims:end -->\n") == "| a |"
    with pytest.raises(AssertionError, match="claims:start"):
        doc_table("no markers here")


def test_results_doc_table_is_the_committed_quick_run():
    claims = json.loads((RESULTS / "claims.json").read_text())
    assert doc_table(RESULTS_DOC.read_text(encoding="utf-8")) == results_markdown(claims).strip()


def test_results_doc_geometry_table_is_the_committed_geometry_run():
    claims = json.loads((GEOMETRY / "claims.json").read_text())
    config = json.loads((GEOMETRY / "config.json").read_text())
    assert config["scale"] == "quick" and config["experiments"] == ["geometry"] and config["seed"] == 0
    assert [c["id"] for c in claims] == ["G1", "G2", "G3", "G4", "G5"]
    assert doc_table(RESULTS_DOC.read_text(encoding="utf-8"), "claims-geometry") == results_markdown(claims).strip()


def test_results_doc_influence_table_is_the_committed_influence_run():
    claims = json.loads((INFLUENCE / "claims.json").read_text())
    config = json.loads((INFLUENCE / "config.json").read_text())
    assert config["scale"] == "quick" and config["experiments"] == ["influence"] and config["seed"] == 0
    assert [c["id"] for c in claims] == ["I1", "I2", "I3", "I4"]
    assert doc_table(RESULTS_DOC.read_text(encoding="utf-8"), "claims-influence") == results_markdown(claims).strip()


def test_results_doc_laws_table_is_the_committed_laws_run():
    claims = json.loads((LAWS / "claims.json").read_text())
    assert [c["id"] for c in claims] == ["L1", "L2", "L3", "L4", "L5"]
    assert doc_table(RESULTS_DOC.read_text(encoding="utf-8"), "claims-laws") == results_markdown(claims).strip()


def test_results_doc_power_table_is_the_committed_power_run():
    claims = json.loads((POWER / "claims.json").read_text())
    assert [c["id"] for c in claims] == ["P1", "P2", "P3"]
    assert doc_table(RESULTS_DOC.read_text(encoding="utf-8"), "claims-power") == results_markdown(claims).strip()


def test_results_doc_energy_table_is_the_committed_energy_run():
    claims = json.loads((ENERGY / "claims.json").read_text())
    config = json.loads((ENERGY / "config.json").read_text())
    assert config["scale"] == "quick" and config["experiments"] == ["energy"] and config["seed"] == 0
    assert [c["id"] for c in claims] == ["E1", "E2"]
    assert doc_table(RESULTS_DOC.read_text(encoding="utf-8"), "claims-energy") == results_markdown(claims).strip()


def test_results_doc_sinks_table_is_the_committed_sinks_run():
    claims = json.loads((SINKS / "claims.json").read_text())
    config = json.loads((SINKS / "config.json").read_text())
    assert config["scale"] == "quick" and config["experiments"] == ["sinks"] and config["seed"] == 0
    assert [c["id"] for c in claims] == ["S1"]
    assert doc_table(RESULTS_DOC.read_text(encoding="utf-8"), "claims-sinks") == results_markdown(claims).strip()


def test_results_doc_geometry_large_table_is_the_committed_run():
    large = ROOT / "docs" / "results" / "geometry-large"
    claims = json.loads((large / "claims.json").read_text())
    config = json.loads((large / "config.json").read_text())
    assert config["scale"] == "large" and config["experiments"] == ["geometry"]
    assert {c["n_samples"] for c in claims} == {64}
    assert doc_table(RESULTS_DOC.read_text(encoding="utf-8"), "claims-geometry-large") == results_markdown(claims).strip()


def test_results_doc_large_table_is_the_committed_large_run():
    large = ROOT / "docs" / "results" / "large"
    claims = json.loads((large / "claims.json").read_text())
    config = json.loads((large / "config.json").read_text())
    assert config["scale"] == "large" and config["overrides"]["n_samples"] == 64
    assert doc_table(RESULTS_DOC.read_text(encoding="utf-8"), "claims-large") == results_markdown(claims).strip()


def test_results_doc_paper_table_is_the_committed_paper_run():
    """Fig. 3 and Fig. 4 at the paper's scale: every row of the committed table is a
    statistic over all 3000 windows (control units: CONTROL_WINDOWS), and docs/results.md quotes that
    run's claims."""
    paper = ROOT / "docs" / "results" / "paper"
    claims = json.loads((paper / "claims.json").read_text())
    config = json.loads((paper / "config.json").read_text())
    assert config["scale"] == "paper" and config["experiments"] == ["fig3", "fig4"] and not config["overrides"]
    table = pd.read_csv(paper / "table.csv")
    # control units (role: control) run on CONTROL_WINDOWS windows at every scale; the rest on all 3000
    from rankcollapse.experiments.config import CONTROL_WINDOWS

    control = table["d_qk"] == 1e8  # fig3's controls: nearly uniform attention (fig3.yaml)
    assert (table.loc[~control, "n_samples"] == 3000).all() and (table.loc[control, "n_samples"] == CONTROL_WINDOWS).all()
    assert control.any() and (~control).any()
    assert doc_table(RESULTS_DOC.read_text(encoding="utf-8"), "claims-paper") == results_markdown(claims).strip()


@pytest.mark.parametrize("name, ids", [("geometry", ["G1", "G2", "G3", "G4", "G5"]), ("laws", ["L1", "L2", "L3", "L4", "L5"]),
                                       ("power", ["P1", "P2", "P3"]), ("energy", ["E1", "E2"]),
                                       ("influence", ["I1", "I2", "I3", "I4"]), ("sinks", ["S1"])])
def test_results_doc_paper_scale_tables_are_the_committed_paper_runs(name, ids):
    run = ROOT / "docs" / "results" / f"{name}-paper"
    claims = json.loads((run / "claims.json").read_text())
    config = json.loads((run / "config.json").read_text())
    assert config["scale"] == "paper" and config["experiments"] == [name] and config["seed"] == 0
    assert [c["id"] for c in claims] == ids
    assert doc_table(RESULTS_DOC.read_text(encoding="utf-8"), f"claims-{name}-paper") == results_markdown(claims).strip()


def test_committed_quick_run_is_todays_run(monkeypatch):
    """Every committed quick-scale run holds the unit keys today's configs plan, hashed with
    the library versions that run recorded (so the check holds on any interpreter's numeric
    stack, while a changed config, rule or NUMERICS_VERSION still fails it): `all` is the
    paper's experiments (docs/results/quick, C06/C07's sequence-length axis included),
    geometry, position bias, the axis alone (docs/results/fig3-n-axis), the temperature laws,
    the power method, energy and the head-wise RMSNorm sinks."""
    from rankcollapse._io import config_hash
    from rankcollapse.sweep import units as sweep_units
    from rankcollapse.sweep.units import NUMERICS_VERSION

    def planned(run: Path, names: str) -> tuple[dict, list[str]]:
        config = json.loads((run / "config.json").read_text())
        assert config["scale"] == "quick" and config["seed"] == 0
        recorded = config["execution"]["numerics"]
        monkeypatch.setattr(sweep_units, "code_fingerprint",
                            lambda: config_hash({**recorded, "numerics": NUMERICS_VERSION}))
        return config, sorted(u.hash for u in runner.plan(names, "quick", 0)[1])

    config, paper = planned(RESULTS, "main,fig2,fig3,fig4,theory")
    assert sorted(config["units"]) == paper
    for run, names in ((GEOMETRY, "geometry"), (INFLUENCE, "influence"), (AXIS, "fig3"), (LAWS, "laws"),
                        (POWER, "power"), (ENERGY, "energy"), (SINKS, "sinks")):
        other, units = planned(run, names)
        assert sorted(other["units"]) == units, run.name
    assert set(runner.resolve_names("all")) == {"main", "fig2", "fig3", "fig4", "theory", "geometry", "influence",
                                                "laws", "power", "energy", "sinks"}


@pytest.mark.slow
def test_committed_quick_run_rechecks():
    if not (RESULTS / "table.parquet").exists():
        pytest.fail("docs/results/quick/table.parquet is missing")
    assert all(stored == again for _, stored, again in runner.recheck(RESULTS))
    assert all(stored == again for _, stored, again in runner.recheck(GEOMETRY))
    assert all(stored == again for _, stored, again in runner.recheck(INFLUENCE))
    assert all(stored == again for _, stored, again in runner.recheck(AXIS))
    assert all(stored == again for _, stored, again in runner.recheck(LAWS))
    assert all(stored == again for _, stored, again in runner.recheck(POWER))
    assert all(stored == again for _, stored, again in runner.recheck(SINKS))


def test_demo_unit_count_in_the_docs_is_todays_plan():
    """README.md and docs/performance.md state the demo's planned units (``make demo``:
    ``reproduce --scale quick``, the main job) as today's plan counts them."""
    cfgs, units, _ = runner.plan("main", "quick", 0)
    near = runner.plan_units(runner.nearby_plan(cfgs, units))
    for doc in (ROOT / "README.md", ROOT / "docs" / "performance.md"):
        text = " ".join(doc.read_text(encoding="utf-8").split())
        m = re.search(r"(\d+) planned units(?: in all)? \((\d+) at the default settings, controls included, and "
                      r"(\d+) nearby settings", text)
        assert m, f"{doc.name} states no planned unit count"
        assert tuple(map(int, m.groups())) == (len(units) + len(near), len(units), len(near)), doc.name
