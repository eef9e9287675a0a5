"""The cost model (``experiments/cost.py``): a unit's work from its parameters, its
estimated CPU-seconds, the estimate printed before a run, against the cost the
committed runs recorded, and shards balanced by it."""

import json
from pathlib import Path

import pytest

from rankcollapse.experiments import cost, runner
from rankcollapse.sweep import Shard, Unit
from tests.cli._harness import run_cli

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
#: committed runs with per-unit timings (the runs the constants are fitted to)
TIMED = sorted(p.parent.name for p in RESULTS.glob("*/config.json") if json.loads(p.read_text()).get("timings"))


def _sim(n_samples, depth, experiment="main", **extra):
    return Unit("simulate", {"model": "minilm", "mask": "causal", "n_samples": n_samples, "depth": depth, **extra},
                experiment=experiment)


def test_work_and_cost_of_hand_built_units():
    u = _sim(2, 3)
    # windows x layers x N d (N + d) at N = 4 tokens, d = 384 (MiniLM's width)
    assert cost.unit_work(u, 4) == 2 * 3 * 4 * 384 * (4 + 384)
    assert cost.unit_work(_sim(2, 3, n_tokens=8), 4) == 2 * 3 * 8 * 384 * (8 + 384)  # a unit's own N wins
    # 10 windows, 2 D = 8 layers, the first 3 windows beyond D: 10 x 4 + 3 x 4 window-layers
    assert cost.unit_work(_sim(10, 8, depth_check_windows=3), 4) == (10 * 4 + 3 * 4) * 4 * 384 * (4 + 384)
    assert cost.unit_work(_sim(2, 8, depth_check_windows=3), 4) == cost.unit_work(_sim(2, 8), 4)
    consts = {"simulate[minilm]": (1.0, 2.0), "probe": (0.5, 0.25)}
    assert cost.unit_cost(u, 4, consts) == 1.0 + 2.0 * cost.unit_work(u, 4)
    probe = Unit("probe", {"model": "gpt2", "n_samples": 8}, experiment="fig4")
    assert cost.unit_class(probe) == "probe[gpt2]"
    assert cost.unit_cost(probe, 16, consts) == 0.5 + 0.25 * 8 * 16  # no class constants: the kind's
    assert cost.unit_cost(Unit("theory", {"check": "basin"}), 16, consts) is None
    assert cost.unit_class(Unit("theory", {"check": "basin"})) == "theory[basin]"


def test_estimate_counts_cached_units_and_the_longest(monkeypatch):
    monkeypatch.setattr(cost, "CONSTANTS", {"simulate[minilm]": (1.0, 0.0), "simulate": (0.0, 0.0)})
    units = [_sim(1, 1), _sim(1, 2), _sim(1, 3, experiment="theory"), _sim(1, 2)]  # the last repeats the second
    est = cost.estimate(units, 4, cached={units[0].hash}, workers=2)
    assert est["experiments"] == {"main": {"units": 2, "cached": 1, "cpu_seconds": 1.0, "unknown": 0},
                                  "theory": {"units": 1, "cached": 0, "cpu_seconds": 1.0, "unknown": 0}}
    assert est["total"]["cpu_seconds"] == 2.0 and est["total"]["units"] == 3 and est["total"]["cached"] == 1
    assert est["total"]["longest_seconds"] == 1.0 and est["total"]["wall_seconds"] == 1.0  # max(2 / 2, 1)
    lines = cost.estimate_lines(est, 2)
    assert lines[0] == "main: 2 units, 1 cached, 1 to compute: ~1.0 CPU-s" and len(lines) == 3
    assert lines[-1].startswith("total: 3 units, 1 cached, 2 to compute: ~2.0 CPU-s; ~1.0 s wall on 2 cores")
    one = cost.estimate(units[:2], 4, workers=None)  # one experiment: the total alone; no wall time on a cluster
    assert cost.estimate_lines(one, None) == ["total: 2 units, 0 cached, 2 to compute: ~2.0 CPU-s "
                                              "(longest unit ~1.0 CPU-s)"]


@pytest.mark.parametrize("name", TIMED)
def test_predicted_cost_of_committed_runs_within_a_factor_of_two(name):
    config = json.loads((RESULTS / name / "config.json").read_text())
    pairs, n_tokens = runner.recorded_units(config)
    assert len(pairs) == len(config["timings"])  # every timed unit is planned again
    predicted = sum(cost.unit_cost(u, n_tokens) for u, _ in pairs)
    recorded = sum(s for _, s in pairs)
    assert 0.5 <= predicted / recorded <= 2.0, (name, predicted, recorded)


def test_quick_and_large_runs_are_among_the_checked_runs():
    assert {"quick", "large", "paper"} <= set(TIMED)


def test_shards_balance_the_estimated_cost():
    # one expensive unit and nine cheap ones: dealt by count, a shard would get the
    # expensive one and four cheap ones (14 against 5); by cost it gets it alone.
    units = [_sim(1, d) for d in range(1, 11)]
    price = {u.hash: (10.0 if u.params["depth"] == 1 else 1.0) for u in units}
    parts = [Shard(i, 2).select(units, cost=lambda u: price[u.hash]) for i in (1, 2)]
    loads = sorted(sum(price[u.hash] for u in p) for p in parts)
    assert loads == [9.0, 10.0]
    assert sorted(u.hash for p in parts for u in p) == sorted(u.hash for u in units)


def test_shards_of_a_planned_run_partition_it_by_cost():
    cfgs, units, data = runner.plan("main", "paper", 0)
    n = data["n_tokens"]
    for k in (2, 3):
        parts = [cost.shard_units(Shard(i, k), units, n) for i in range(1, k + 1)]
        assert sorted(u.hash for p in parts for u in p) == sorted(u.hash for u in units)
        loads = [sum(cost.unit_cost(u, n) for u in p) for p in parts]
        assert max(loads) - min(loads) <= max(cost.unit_cost(u, n) for u in units)


def test_dry_run_prints_the_estimate_and_writes_nothing(tmp_path):
    res = run_cli("reproduce", "power", "--scale", "paper", "--dry-run", "--out", "o", "--cache-dir", "c",
                  "--format", "json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    est = json.loads(res.stdout)
    assert list(est["experiments"]) == ["power"] and est["total"]["cached"] == 0 and est["workers"] == 1
    cfgs, units, data = runner.plan("power", "paper", 0)
    assert est["total"]["units"] == len(units)
    assert est["total"]["cpu_seconds"] == pytest.approx(sum(cost.unit_cost(u, data["n_tokens"]) for u in units))
    assert list(tmp_path.iterdir()) == []
    text = run_cli("reproduce", "power", "--scale", "paper", "--dry-run", "--executor", "processes", "--workers", "2",
                   "--out", "o", "--cache-dir", "c", cwd=tmp_path)
    assert text.returncode == 0 and "total: 18 units, 0 cached, 18 to compute" in text.stdout
    assert "s wall on 2 cores" in text.stdout and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--wait", "--allow-nonempty", "--no-progress"])
def test_dry_run_refuses_options_it_cannot_apply(flag, tmp_path):
    res = run_cli("reproduce", "power", "--scale", "smoke", "--dry-run", flag, "--out", "o", cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and flag.split("-")[-1] in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_dry_run_refuses_an_out_that_is_a_file(tmp_path):
    (tmp_path / "o").write_text("mine")  # the run would refuse it: so does its estimate
    res = run_cli("reproduce", "power", "--scale", "smoke", "--dry-run", "--out", "o", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == ["rankcollapse: error: --out 'o' is an existing file, not a folder"]
    assert (tmp_path / "o").read_text() == "mine"


@pytest.mark.parametrize("model, message", [
    ("", "model '' is empty; give 'minilm', 'smollm2', a model folder or a hub name"),  # was the working directory
    (" ", "model ' ' is empty; give 'minilm', 'smollm2', a model folder or a hub name"),  # was a hub name
    ("my model", "model 'my model' is neither 'minilm', 'smollm2', a local folder nor a hub name"),
])
def test_an_empty_or_spaced_model_name_is_refused(tmp_path, model, message):
    from rankcollapse.errors import ModelError
    from rankcollapse.models.source import check_model_source

    with pytest.raises(ModelError) as info:
        check_model_source(model, local_files_only=True)
    assert str(info.value) == message
    res = run_cli("reproduce", "main", "--scale", "smoke", "--dry-run", "--model", model, "--out", "o", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [f"rankcollapse: error: {message}"]
    assert check_model_source("openai-community/gpt2", local_files_only=True) is False


@pytest.mark.parametrize("content, message", [
    ("not json{", "is not readable JSON (JSONDecodeError: Expecting value: line 1 column 1 (char 0))"),
    ("", "is not readable JSON (JSONDecodeError: Expecting value: line 1 column 1 (char 0))"),
    ("[1, 2]", "holds a JSON list, not an object of settings"),
])
def test_dry_run_refuses_a_model_config_that_is_no_json_object(tmp_path, content, message):
    """The run refuses it when the model loads (after the other units): its dry run, and the run, at once."""
    from rankcollapse.errors import ModelError
    from rankcollapse.models.source import check_model_source

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(content)
    want = f"model config {str(tmp_path / 'm' / 'config.json')!r} {message}"
    with pytest.raises(ModelError) as info:
        check_model_source(str(tmp_path / "m"))
    assert str(info.value) == want
    res = run_cli("reproduce", "main", "--scale", "smoke", "--dry-run", "--model", str(tmp_path / "m"), "--out", "o",
                  cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [f"rankcollapse: error: {want}"]


def test_dry_run_refuses_a_model_folder_the_run_would_refuse(tmp_path):
    """``--model DIR`` is checked as the run checks it (models.source.check_model_source), with
    its one-line message and exit 2, before the experiments (torch) load; a model folder passes."""
    import re
    import subprocess
    import sys

    from rankcollapse.errors import ModelError

    (tmp_path / "nocfg").mkdir()
    (tmp_path / "afile").write_text("x")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"model_type": "gpt2"}')
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{")
    missing = str(tmp_path / "nomodel")
    expected = {missing: f"model {missing!r} is neither 'minilm', 'smollm2', a local folder nor a hub name",
                str(tmp_path / "nocfg"): f"model folder {str(tmp_path / 'nocfg')!r} has no config.json; it is not "
                                         "a Hugging Face model folder",
                str(tmp_path / "afile"): f"model path {str(tmp_path / 'afile')!r} is not a folder; give a folder "
                                         "with config.json and weights",
                str(tmp_path / "bad"): f"weights file {str(tmp_path / 'bad' / 'model.safetensors')!r} is corrupt or "
                                       "truncated"}
    for model, message in expected.items():
        for dry in (["--dry-run"], []):  # the run's refusal, and the dry run's: the same line
            res = run_cli("reproduce", "main", "--scale", "smoke", *dry, "--model", model, "--out", "o", cwd=tmp_path)
            assert res.returncode == 2 and res.stdout == "", res.stderr
            line, = res.stderr.strip().splitlines()
            assert line.startswith(f"rankcollapse: error: {message}"), line
        with pytest.raises(ModelError, match="^" + re.escape(message)):
            runner.estimate_run("main", "smoke", tmp_path / "o", overrides={"extra_models": [model]})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "bad", "nocfg"]  # nothing written
    probe = ("import sys\nfrom rankcollapse.cli import run\ncode = run(sys.argv[1:])\n"
             "print(code, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe, "reproduce", "--dry-run", "--model", missing, "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["2", "False"], proc.stderr
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "config.json").write_text('{"model_type": "gpt2"}')  # a model folder: the dry run plans it
    res = run_cli("reproduce", "main", "--scale", "smoke", "--dry-run", "--model", str(tmp_path / "ok"), "--out", "o",
                  "--format", "json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["total"]["units"] > 0
