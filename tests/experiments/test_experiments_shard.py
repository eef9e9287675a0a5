"""Sharded runs: ``reproduce NAME --shard I/K`` computes shard I of K of the run's units
into a shared cache and writes nothing else; the run without ``--shard`` on that cache
computes nothing new and writes the result of a one-machine run."""

import json

import pandas as pd
import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import ExecutionConfig, StorageConfig, runner
from rankcollapse.experiments.cost import shard_units
from rankcollapse.sweep import Shard
from tests.cli._harness import run_cli

#: claims.json fields that record when or how long, not what was measured
TIMING = ("seconds", "wall_seconds", "cpu_seconds", "computed_at")


def _untimed(obj):
    if isinstance(obj, dict):
        return {k: _untimed(v) for k, v in obj.items() if k not in TIMING}
    if isinstance(obj, list):
        return [_untimed(v) for v in obj]
    return obj


def test_two_shards_then_the_merge_equal_one_run(fake, tmp_path):
    serial = run_cli("reproduce", "theory", "--scale", "smoke", "--out", "one", "--cache-dir", "c1", "--no-progress",
                     cwd=tmp_path)
    assert serial.returncode == 0, serial.stderr
    planned = json.loads((tmp_path / "one" / "config.json").read_text())["cost"]["units"]
    calls = fake.calls
    assert calls == planned  # a one-machine run computes every unit once

    shards = []
    for i in (1, 2):
        res = run_cli("reproduce", "theory", "--scale", "smoke", "--shard", f"{i}/2", "--cache-dir", "c2",
                      "--out", "merged", "--format", "json", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        shards.append(json.loads(res.stdout))
    assert [s["shard"] for s in shards] == ["1/2", "2/2"]
    assert all(s["units_computed"] == s["units"] and s["units_cached"] == 0 for s in shards)
    assert fake.calls - calls == sum(s["units"] for s in shards)  # no unit computed by both shards
    assert not (tmp_path / "merged").exists()  # a shard writes only into the cache
    hashes = {s["config_hash"] for s in shards}
    calls = fake.calls

    merge = run_cli("reproduce", "theory", "--scale", "smoke", "--out", "merged", "--cache-dir", "c2", "--no-progress",
                    cwd=tmp_path)
    assert merge.returncode == 0, merge.stderr
    assert fake.calls == calls  # the merge computes nothing
    one, merged = tmp_path / "one", tmp_path / "merged"
    cfg = json.loads((merged / "config.json").read_text())
    assert cfg["cost"]["units_computed"] == 0 and cfg["cost"]["units"] == planned
    assert hashes == {cfg["config_hash"]} == {json.loads((one / "config.json").read_text())["config_hash"]}
    pd.testing.assert_frame_equal(pd.read_parquet(merged / "table.parquet"), pd.read_parquet(one / "table.parquet"),
                                  check_exact=True)
    assert (merged / "table.csv").read_bytes() == (one / "table.csv").read_bytes()
    claims = [json.loads((d / "claims.json").read_text()) for d in (one, merged)]
    assert claims[0] and _untimed(claims[0]) == _untimed(claims[1])


def test_shard_api_returns_its_rows_and_no_claims(fake, tmp_path):
    shard = Shard(1, 3)
    res = runner.run_experiment("fig3", "smoke", tmp_path / "run", execution=ExecutionConfig(progress=False,
                                                                                                shard="1/3"),
                                storage=StorageConfig(cache_dir=tmp_path / "cache"))
    cfgs, units, data = runner.plan("fig3", "smoke", 0)
    near = runner.plan_units(runner.nearby_plan(cfgs, units))
    mine = shard_units(shard, units + near, data["n_tokens"])  # balanced by estimated cost
    assert res.claims == [] and res.config["shard"] == "1/3"
    assert set(res.table["unit"]) == {u.hash for u in mine} and res.config["cost"]["units"] == len(mine)
    assert not (tmp_path / "run").exists()


def test_shards_partition_the_units_by_key():
    cfgs, units, _ = runner.plan("main", "smoke", 0)
    units = units + runner.plan_units(runner.nearby_plan(cfgs, units))
    for k in (1, 2, 3, 7):
        parts = [Shard(i, k).select(units) for i in range(1, k + 1)]
        keys = [u.hash for p in parts for u in p]
        assert sorted(keys) == sorted(u.hash for u in units)  # every unit in exactly one shard
        assert [Shard(i, k).select(list(reversed(units))) for i in range(1, k + 1)] == [p[::-1] for p in parts]
        from rankcollapse.sweep.progress import cost_class
        for cls in {cost_class(u) for u in units}:  # each class dealt evenly
            counts = [sum(cost_class(u) == cls for u in p) for p in parts]
            assert max(counts) - min(counts) <= 1


def test_more_shards_than_units_leave_the_rest_empty():
    """With K at least the number of units, shard i holds the i-th unit of the greedy order
    and every later shard is empty, whatever K is (10**20 included: no list of K loads)."""
    _, units, _ = runner.plan("main", "smoke", 0)
    n = len({u.hash for u in units})
    one_each = [Shard(i, n).select(units) for i in range(1, n + 1)]
    assert all(len(p) == 1 for p in one_each)
    for k in (n + 3, 10**20):
        assert [Shard(i, k).select(units) for i in range(1, n + 1)] == one_each
        assert Shard(n + 1, k).select(units) == [] and Shard(k, k).select(units) == []


@pytest.mark.parametrize("spec", ["0/2", "3/2", "a/b", "1/0", "-1/2", "1/2/3", "1", ""])
def test_bad_shard_specs_are_refused(spec, tmp_path):
    with pytest.raises(ConfigError) as exc:
        ExecutionConfig(shard=spec)
    assert exc.value.argument == "shard"
    res = run_cli("reproduce", "main", "--scale", "smoke", "--shard", spec, "--out", "o", "--cache-dir", "c",
                  cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and "--shard" in res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, flag", [
    (["reproduce", "summary", "run", "--shard", "1/2"], "--shard"),
    (["reproduce", "audit", "run", "--shard", "1/2"], "--shard"),
    (["reproduce", "main", "--scale", "smoke", "--shard", "1/2", "--wait", "--cache-dir", "c"], "--wait"),
    (["reproduce", "main", "--scale", "smoke", "--shard", "1/2", "--allow-nonempty", "--cache-dir", "c"],
     "--allow-nonempty"),
])
def test_shard_with_an_option_it_cannot_apply_is_refused(argv, flag, tmp_path):
    res = run_cli(*argv, cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and flag in res.stderr
    assert list(tmp_path.iterdir()) == []
