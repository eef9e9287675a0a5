"""Config keys in the project's vocabulary: configs, unit keys and run hashes use today's
names (``n_tokens``, ``n_samples``, ``d_model``); any other key is refused like an
unknown key, and every committed run's hash is recomputed from its config.json."""

import copy
import json
from pathlib import Path

import pytest

from rankcollapse._io import config_hash
from rankcollapse.errors import ConfigError
from rankcollapse.experiments import runner
from rankcollapse.experiments.config import load_config
from rankcollapse.experiments.schema import validate_config, validate_study
from rankcollapse.sweep.units import Unit, code_fingerprint, unit_kind

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_packaged_configs_use_todays_names():
    for name in ("main", "fig2", "fig3", "fig4", "theory", "geometry"):
        cfg = load_config(name)
        blob = json.dumps(cfg)
        assert cfg["data"]["n_tokens"] == 128 and "length" not in cfg["data"]
        assert '"n_windows"' not in blob and '"windows_per_model"' not in blob
    theory = load_config("theory")["units"][2]["params"]
    assert (theory["n_tokens"], theory["d_model"], theory["eq_n_tokens"], theory["eq_d_model"],
            theory["rate_n_tokens"]) == (16, 8, 4, 4, 128)


def test_a_data_key_that_is_not_todays_is_unknown():
    cfg = copy.deepcopy(load_config("fig2"))
    cfg["data"]["length"] = cfg["data"].pop("n_tokens")
    with pytest.raises(ConfigError, match="length"):
        validate_config(cfg, "fig2")


def test_unit_key_hashes_the_parameters_as_spelt():
    p = {"model": "minilm", "mask": "causal", "variant": "pure", "n_samples": 8, "depth": 64, "seed": 0,
         "data": {"corpus": "wikipedia", "n_tokens": 128, "seed": 0}}
    assert Unit("simulate", p).hash == config_hash({"kind": "simulate", "params": p, "v": 3, "code": code_fingerprint()})
    # a text file counts by its content's digest, not by where it lies
    with_path = {**p, "data": {**p["data"], "corpus": "file", "path": "/somewhere/a.txt", "sha256": "ab"}}
    moved = {**with_path, "data": {**with_path["data"], "path": "/elsewhere/a.txt"}}
    assert Unit("simulate", with_path).hash == Unit("simulate", moved).hash
    assert unit_kind("theory").key_params is unit_kind("simulate").key_params
    assert runner.plan("fig3", "smoke", 0)[2] == {"corpus": "wikipedia", "n_tokens": 128, "seed": 0}


def test_old_override_key_is_unknown():
    with pytest.raises(ConfigError, match="unknown key 'n_windows'"):
        runner.plan("fig3", "smoke", 0, overrides={"n_windows": 2})


def test_run_hash_is_the_hash_of_the_body():
    cfgs, units, data = runner.plan("fig3", "smoke", 0, overrides={"n_samples": 2})
    conf = runner.run_config(cfgs, "smoke", 0, data, {"n_samples": 2}, units)
    body = {"experiments": ["fig3"], "scale": "smoke", "seed": 0, "data": {"corpus": "wikipedia", "n_tokens": 128, "seed": 0},
            "overrides": {"n_samples": 2}, "configs": cfgs}
    assert conf["config_hash"] == config_hash(body)


#: committed runs whose configs are today's (an amended config is a new run: move it below)
UNAMENDED = ["fig3-n-axis", "laws-quick", "power-quick", "energy-quick", "sinks-quick", "power-paper", "geometry-paper", "laws-paper", "energy-paper", "influence-paper", "sinks-paper"]
#: committed runs whose configs were amended after they ran (their config.json keeps the old ones)
AMENDED = ["quick", "large", "paper", "geometry-quick", "geometry-large", "influence-quick"]


def _body(stored: dict) -> dict:
    """The part of a config.json the run hash covers."""
    return {k: stored[k] for k in ("experiments", "scale", "seed", "data", "overrides", "configs")}


@pytest.mark.parametrize("run", UNAMENDED + AMENDED)
def test_every_committed_run_hash_is_recomputed_from_its_config(run):
    stored = json.loads((RESULTS / run / "config.json").read_text())
    assert config_hash(_body(stored)) == stored["config_hash"]
    blob = json.dumps(_body(stored))
    assert '"length"' not in blob and '"n_windows"' not in blob and '"windows_per_model"' not in blob
    assert f"config_hash {stored['config_hash']}" in (RESULTS / run / "COMPLETE").read_text()


@pytest.mark.parametrize("run", UNAMENDED)
def test_committed_runs_keep_their_run_hash(run):
    """Planned today, each committed run of an unamended config has the config_hash its
    config.json records (the hash covers configs, data and overrides, not library versions)."""
    stored = json.loads((RESULTS / run / "config.json").read_text())
    today = [json.loads(json.dumps(load_config(c["name"]))) for c in stored["configs"]]  # JSON keys are strings
    assert stored["configs"] == today, f"{run}'s config was amended"
    cfgs, units, data = runner.plan(",".join(stored["experiments"]), stored["scale"], stored["seed"],
                                    overrides=stored["overrides"])
    conf = runner.run_config(cfgs, stored["scale"], stored["seed"], data, stored["overrides"], units)
    assert conf["config_hash"] == stored["config_hash"]


def test_schedule_study_takes_d_model_only():
    from rankcollapse.experiments.schedules import _read_study

    new = _read_study()
    assert new["simulation"]["d_model"] == 16
    validate_study(new)
    old = copy.deepcopy(new)
    old["simulation"]["d"] = old["simulation"].pop("d_model")
    with pytest.raises(ConfigError):
        validate_study(old)


def test_report_header_names_the_window_length():
    from types import SimpleNamespace

    from rankcollapse.experiments.report import header_fields

    data = {"corpus": "wikipedia", "n_tokens": 128, "seed": 0}
    result = SimpleNamespace(config={"data": data, "experiments": ["fig3"], "scale": "smoke", "config_hash": "x",
                                     "seed": 0, "overrides": {}}, claims=[], seconds=1.0)
    assert dict(header_fields(result))["Input"] == "wikipedia, windows of 128 tokens, data seed 0"


def test_depth_check_windows_enter_only_the_keys_of_units_with_more_windows(monkeypatch):
    """A simulate unit with more than ``DEPTH_CHECK_WINDOWS`` windows runs layers beyond
    D on that many (a parameter, so in its key); one with fewer keeps today's parameters
    and key (every committed run: large has 256 windows)."""
    from rankcollapse.experiments import config
    from rankcollapse.experiments.config import expand_units

    cfg, data = load_config("main"), {"corpus": "wikipedia", "n_tokens": 128, "seed": 0}
    k = config.DEPTH_CHECK_WINDOWS
    for scale, n in (("large", 256), ("paper", 3000)):
        sims = [u for u in expand_units(cfg, scale, 0, data=data) if u.kind == "simulate"]
        assert {(u.params["n_samples"], u.params.get("depth_check_windows")) for u in sims} == (
            {(n, k if n > k else None), (config.CONTROL_WINDOWS, None)})
    smoke = expand_units(cfg, "smoke", 0, data=data)  # 4 windows
    monkeypatch.setattr(config, "DEPTH_CHECK_WINDOWS", 4)
    assert [u.hash for u in expand_units(cfg, "smoke", 0, data=data)] == [u.hash for u in smoke]
    monkeypatch.setattr(config, "DEPTH_CHECK_WINDOWS", 3)
    fewer = expand_units(cfg, "smoke", 0, data=data)
    assert {u.params.get("depth_check_windows") for u in fewer if u.kind == "simulate"} == {3}
    assert [u.hash for u in fewer if u.kind != "simulate"] == [u.hash for u in smoke if u.kind != "simulate"]
