"""Runner mechanics with a synthetic executor: outputs, cache reuse, resume after an
interruption, the completion marker, and verdicts recomputed from the stored table."""

import json

import numpy as np
import pytest

from rankcollapse.experiments import runner
from rankcollapse.experiments.table import rows_from_metrics
from rankcollapse.experiments.units import _labels

METRICS = ("mu", "mu_relative", "avg_abs_cos", "rank_fraction", "sigma_min", "measured_rate", "n_equilibria",
           "expected_min", "basin_ci_low")


class FakeExecutor:
    """Deterministic rows: metric value exp(-rate * layer), rate from the unit hash."""

    def __init__(self, fail_after: int | None = None):
        self.calls = 0
        self.fail_after = fail_after

    def __call__(self, unit, ctx):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt
        self.calls += 1
        depth = int(unit.params.get("depth", 6))
        rate = int(unit.hash[:4], 16) / 65535.0
        vals = np.exp(-rate * np.arange(depth + 1))[:, None] * np.ones((1, 2))
        return rows_from_metrics({m: vals for m in METRICS}, _labels(unit))


@pytest.fixture
def fake(monkeypatch):
    ex = FakeExecutor()
    monkeypatch.setattr(runner, "EXECUTORS", {k: ex for k in ("simulate", "probe", "pretrained_sa", "theory")})
    monkeypatch.setattr(runner, "_preflight", lambda ctx, units: None)
    return ex


def test_outputs_cache_and_recheck(fake, tmp_path):
    out = tmp_path / "run"
    res = runner.run_experiment("main", "smoke", out, seed=3, progress=False, nearby=False)
    n_units = fake.calls
    assert n_units == len(res.config["units"]) > 0
    for name in ("table.parquet", "table.csv", "claims.json", "config.json", "report.html", "report.md", "COMPLETE"):
        assert (out / name).is_file(), name
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config_hash"] == res.config["config_hash"] and cfg["versions"]["torch"]
    assert all(s == r for _, s, r in runner.recheck(out))
    again = runner.run_experiment("main", "smoke", tmp_path / "run2", seed=3, progress=False, nearby=False)
    assert fake.calls == n_units  # everything came from the shared cache
    assert again.config["config_hash"] == res.config["config_hash"]
    assert again.table.equals(res.table)
    other = runner.run_experiment("main", "smoke", tmp_path / "run3", seed=4, progress=False, nearby=False, write=False)
    assert other.config["config_hash"] != res.config["config_hash"] and fake.calls > n_units


def test_interrupted_run_resumes_and_is_not_marked_complete(monkeypatch, tmp_path):
    flaky = FakeExecutor(fail_after=3)
    monkeypatch.setattr(runner, "EXECUTORS", {k: flaky for k in ("simulate", "probe", "pretrained_sa", "theory")})
    monkeypatch.setattr(runner, "_preflight", lambda ctx, units: None)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        runner.run_experiment("main", "smoke", out, progress=False, nearby=False)
    assert not (out / "COMPLETE").exists() and not (out / "report.html").exists()
    assert len(list((tmp_path / ".rankcollapse-cache").glob("*.parquet"))) == 3
    resumed = FakeExecutor()
    monkeypatch.setattr(runner, "EXECUTORS", {k: resumed for k in ("simulate", "probe", "pretrained_sa", "theory")})
    res = runner.run_experiment("main", "smoke", out, progress=False, nearby=False)
    assert resumed.calls == len(res.config["units"]) - 3
    assert (out / "COMPLETE").exists()


def test_all_writes_twelve_claims(fake, tmp_path):
    res = runner.run_experiment("all", "smoke", tmp_path / "all", progress=False, nearby=False)
    claims = json.loads((tmp_path / "all" / "claims.json").read_text())
    assert [c["id"] for c in claims] == [f"C{k:02d}" for k in range(1, 13)]
    for c in claims:
        assert {"id", "effect", "verdict", "measured", "rule", "experiment", "comparison", "plot", "notes"} <= set(c)
        assert c["verdict"] in ("reproduced", "not reproduced", "mixed", "not run")
    assert set(res.config["experiments"]) == {"main", "fig2", "fig3", "fig4", "theory"}


def test_nearby_settings_run_for_claims_not_reproduced(fake, tmp_path):
    res = runner.run_experiment("fig2", "smoke", tmp_path / "f2", progress=False)
    for c in res.claims:
        if c["verdict"] in ("not reproduced", "mixed") and c["id"] != "C03":
            assert c["nearby"], c["id"]
            assert set(res.table["setting"]) >= {n["setting"] for n in c["nearby"]}
        if c["verdict"] == "reproduced":
            assert c["nearby"] == []
