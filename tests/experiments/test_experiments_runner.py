"""Runner mechanics with a synthetic executor: outputs, cache reuse, resume after an
interruption, the completion marker, and verdicts recomputed from the stored table."""

import json

import pytest

from rankcollapse.experiments import ExecutionConfig, StorageConfig, runner
from rankcollapse.experiments.claims import VERDICTS as C_VERDICTS

QUIET = ExecutionConfig(progress=False)
IN_MEMORY = StorageConfig(write=False)  # no output folder

def test_outputs_cache_and_recheck(fig3_seed3, fake):
    res, n_units = fig3_seed3
    out = res.out
    assert n_units == len(res.config["units"]) > 0
    for name in ("table.parquet", "table.csv", "claims.json", "config.json", "report.html", "report.md", "COMPLETE"):
        assert (out / name).is_file(), name
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config_hash"] == res.config["config_hash"] and cfg["versions"]["torch"]
    assert all(s == r for _, s, r in runner.recheck(out))
    again = runner.run_experiment("fig3", "smoke", out.parent / "run2", seed=3, nearby=False, execution=QUIET)
    assert fake.calls == 0  # everything came from the shared cache
    assert again.config["config_hash"] == res.config["config_hash"]
    assert again.table.equals(res.table)
    other = runner.run_experiment("fig3", "smoke", out.parent / "run3", seed=4, nearby=False, execution=QUIET,
                                  storage=IN_MEMORY)
    assert other.config["config_hash"] != res.config["config_hash"] and fake.calls > 0


def test_interrupted_run_resumes_and_is_not_marked_complete(install_executor, fake_executor_cls, tmp_path):
    install_executor(fake_executor_cls(fail_after=3))
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        runner.run_experiment("theory", "smoke", out, nearby=False, execution=QUIET)
    assert not (out / "COMPLETE").exists() and not (out / "report.html").exists()
    assert len(list((tmp_path / ".rankcollapse-cache").glob("*.parquet"))) == 3
    resumed = install_executor(fake_executor_cls())
    res = runner.run_experiment("theory", "smoke", out, nearby=False, execution=QUIET)
    assert resumed.calls == len(res.config["units"]) - 3
    assert (out / "COMPLETE").exists()


@pytest.mark.slow  # reads the whole `all` smoke run: CI runs it with the slow tests
def test_all_writes_every_claim(all_smoke):
    res = all_smoke
    claims = json.loads((res.out / "claims.json").read_text())
    paper = [f"C{k:02d}" + axis for k in range(1, 13)
             for axis in (["", ".N128", ".N1024"] if k in (6, 7) else [""])]  # smoke: the N axis up to 1,024
    assert [c["id"] for c in claims] == (paper + ["E1", "E2"] + [f"G{k}" for k in range(1, 6)]
                                         + [f"I{k}" for k in range(1, 5)] + ["L1", "L2", "L3", "L4", "L5", "P1", "P2", "P3", "S1"])
    for c in claims:
        assert {"id", "effect", "verdict", "measured", "rule", "experiment", "comparison", "plot", "notes"} <= set(c)
        assert c["verdict"] in C_VERDICTS
    assert set(res.config["experiments"]) == {"main", "fig2", "fig3", "fig4", "theory", "geometry", "influence", "laws",
                                              "power", "energy", "sinks"}


def test_run_result_to_pandas_table_and_claims(fig3_seed3):
    import math

    import pandas as pd

    from rankcollapse.errors import ConfigError

    res = fig3_seed3[0]
    table = res.to_pandas()
    assert table.equals(res.table) and table is not res.table
    for col in ("layer", "point", "metric", "mean", "seed"):
        assert col in table.columns
    claims = res.to_pandas("claims")
    assert list(claims["id"]) == [c["id"] for c in res.claims]
    assert list(claims["verdict"]) == [c["verdict"] for c in res.claims]
    for (_, row), c in zip(claims.iterrows(), res.claims):
        low, high = c["interval"] or (None, None)
        for got, want in ((row["interval_low"], low), (row["interval_high"], high), (row["measured"], c["measured"])):
            assert (want is None and (got is None or pd.isna(got))) or math.isclose(got, want) or (got != got and want != want)
    facts = res.to_dict()
    assert facts["rows"] == len(res.table) and facts["claims"] == len(res.claims)
    assert sum(v for k, v in facts.items() if k.startswith("verdict: ")) == len(res.claims)
    assert "RunResult" in res._repr_html_() and len(repr(res)) < 300
    with pytest.raises(ConfigError, match="claims"):
        res.to_pandas("claim")
