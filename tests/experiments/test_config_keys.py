"""Renamed config keys (rankcollapse.experiments.keys): the new name works, the old one
warns (FutureWarning, removal 0.3.0) and gives the identical config, unit key and run
hash, and every hash is computed on the stored (old) spelling, so cache entries and the
committed runs keep their keys."""

import copy
import json
import warnings
from pathlib import Path

import pytest

from rankcollapse._io import config_hash
from rankcollapse.errors import ConfigError
from rankcollapse.experiments import keys, runner
from rankcollapse.experiments.config import load_config
from rankcollapse.experiments.schema import validate_config, validate_study
from rankcollapse.sweep.units import Unit, code_fingerprint

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _no_warning(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn()


def _old_spelling(cfg):
    """``cfg`` rewritten by hand with every key as it was spelt before the rename."""
    cfg = copy.deepcopy(cfg)
    cfg["data"]["length"] = cfg["data"].pop("n_tokens")
    for sc in cfg["scales"].values():
        if "n_samples" in sc:
            sc["n_windows"] = sc.pop("n_samples")
        if "n_samples_per_model" in sc:
            sc["windows_per_model"] = sc.pop("n_samples_per_model")
    for unit in cfg["units"]:
        for old, new in (("n", "n_tokens"), ("d", "d_model"), ("eq_n", "eq_n_tokens"), ("eq_d", "eq_d_model"),
                         ("rate_n", "rate_n_tokens")):
            if new in unit.get("params", {}):
                unit["params"][old] = unit["params"].pop(new)
    text = json.dumps(cfg).replace('"stat": "envelope_rate", "n_tokens":', '"stat": "envelope_rate", "n":')
    return json.loads(text)


def test_packaged_configs_use_the_new_names_without_warnings():
    for name in ("main", "fig2", "fig3", "fig4", "theory", "geometry"):
        cfg = _no_warning(lambda: load_config(name))
        blob = json.dumps(cfg)
        assert cfg["data"]["n_tokens"] == 128 and "length" not in cfg["data"]
        assert '"n_windows"' not in blob and '"windows_per_model"' not in blob
    theory = load_config("theory")["units"][2]["params"]
    assert (theory["n_tokens"], theory["d_model"], theory["eq_n_tokens"], theory["eq_d_model"],
            theory["rate_n_tokens"]) == (16, 8, 4, 4, 128)


def test_stored_form_is_the_old_spelling():
    for name in ("fig2", "theory"):
        cfg = load_config(name)
        assert keys.stored_config(cfg) == _old_spelling(cfg)


@pytest.mark.parametrize("name", ["fig2", "theory"])
def test_old_keys_in_a_config_warn_and_validate_identically(name):
    new = load_config(name)
    old = _old_spelling(new)
    with pytest.warns(FutureWarning, match=r"config key .*\.length is deprecated and will be removed in 0\.3\.0; use n_tokens"):
        model_old = validate_config(old, name)
    assert model_old == _no_warning(lambda: validate_config(new, name))
    with pytest.warns(FutureWarning):
        assert keys.current_config(old) == new


def test_old_theory_params_warn_and_keep_the_unit_key():
    new = load_config("theory")
    params = new["units"][2]["params"]
    with pytest.warns(FutureWarning, match=r"theory\.units\[2\]\.params\.eq_n is deprecated .* 0\.3\.0; use eq_n_tokens"):
        renamed = keys.current_config(_old_spelling(new))
    assert renamed["units"][2]["params"] == params
    p = {**params, "check": "equilibria", "data": {"corpus": "wikipedia", "n_tokens": 128, "seed": 0}, "seed": -1}
    old_p = {**{k: v for k, v in p.items() if k not in ("n_tokens", "d_model", "eq_n_tokens", "eq_d_model", "rate_n_tokens")},
             "n": 16, "d": 8, "eq_n": 4, "eq_d": 4, "rate_n": 128, "data": {"corpus": "wikipedia", "length": 128, "seed": 0}}
    # the key as it was computed before the rename: the kind, the old spelling, version 4
    assert Unit("theory", p).hash == config_hash({"kind": "theory", "params": old_p, "v": 4, "code": code_fingerprint()})


def test_unit_key_hashes_the_old_spelling():
    p = {"model": "minilm", "mask": "causal", "variant": "pure", "n_samples": 8, "depth": 64, "seed": 0,
         "data": {"corpus": "wikipedia", "n_tokens": 128, "seed": 0}}
    old = {**{k: v for k, v in p.items() if k != "n_samples"}, "n_windows": 8,
           "data": {"corpus": "wikipedia", "length": 128, "seed": 0}}
    assert Unit("simulate", p).hash == config_hash({"kind": "simulate", "params": old, "v": 3, "code": code_fingerprint()})
    # the data spec is spelt the new way; only the key reads the old spelling
    assert runner.plan("fig3", "smoke", 0)[2] == {"corpus": "wikipedia", "n_tokens": 128, "seed": 0}


def test_old_override_key_warns_and_gives_the_same_units():
    _, new, _ = _no_warning(lambda: runner.plan("fig3", "smoke", 0, overrides={"n_samples": 2}))
    with pytest.warns(FutureWarning, match=r"overrides\.n_windows is deprecated and will be removed in 0\.3\.0; use n_samples"):
        _, old, _ = runner.plan("fig3", "smoke", 0, overrides={"n_windows": 2})
    assert [u.hash for u in old] == [u.hash for u in new] and all(u.params.get("n_samples", 2) == 2 for u in new)
    with pytest.raises(ConfigError, match="not both"):
        runner.plan("fig3", "smoke", 0, overrides={"n_windows": 2, "n_samples": 2})


def test_run_hash_reads_overrides_and_data_in_the_stored_spelling():
    cfgs, units, data = runner.plan("fig3", "smoke", 0, overrides={"n_samples": 2})
    conf = runner.run_config(cfgs, "smoke", 0, data, {"n_samples": 2}, units)
    body = {"experiments": ["fig3"], "scale": "smoke", "seed": 0, "data": {"corpus": "wikipedia", "length": 128, "seed": 0},
            "overrides": {"n_windows": 2}, "configs": [_old_spelling(cfgs[0])]}
    assert conf["config_hash"] == config_hash(body)
    assert conf["overrides"] == {"n_samples": 2} and conf["data"]["n_tokens"] == 128  # config.json: the new names


#: committed runs whose configs are today's (an amended config is a new run: move it below)
UNAMENDED = ["fig3-n-axis", "laws-quick"]
#: committed runs whose configs were amended after they ran (their config.json keeps the old ones)
AMENDED = ["quick", "large", "paper", "geometry-quick", "geometry-large", "influence-quick"]


def _body_in_todays_spelling(stored: dict) -> dict:
    """The part of a config.json the run hash covers, with its configs, data and overrides
    read in today's spelling (as :func:`runner.recheck` reads a stored run)."""
    return {"experiments": stored["experiments"], "scale": stored["scale"], "seed": stored["seed"],
            "data": keys.current(stored["data"], "data"), "overrides": keys.current(stored["overrides"], "overrides"),
            "configs": [keys.current_config(c, warn=False) for c in stored["configs"]]}


@pytest.mark.parametrize("run", UNAMENDED + AMENDED)
def test_every_committed_run_hash_is_recomputed_from_its_config_in_todays_spelling(run):
    """Renaming keys keeps every run's hash: the stored spelling of a config.json read in
    today's names hashes to the config_hash it records, amended configs included."""
    stored = json.loads((RESULTS / run / "config.json").read_text())
    assert config_hash(keys.stored_run(_body_in_todays_spelling(stored))) == stored["config_hash"]


@pytest.mark.parametrize("run", UNAMENDED)
def test_committed_runs_keep_their_run_hash(run):
    """Planned today, each committed run of an unamended config has the config_hash its
    config.json records (the hash covers configs, data and overrides, not library versions)."""
    stored = json.loads((RESULTS / run / "config.json").read_text())
    today = [json.loads(json.dumps(load_config(c["name"]))) for c in stored["configs"]]  # JSON keys are strings
    assert [keys.current_config(c, warn=False) for c in stored["configs"]] == today, f"{run}'s config was amended"
    cfgs, units, data = runner.plan(",".join(stored["experiments"]), stored["scale"], stored["seed"],
                                    overrides=stored["overrides"])
    conf = runner.run_config(cfgs, stored["scale"], stored["seed"], data, stored["overrides"], units)
    assert conf["config_hash"] == stored["config_hash"]


def test_old_quantity_key_warns_and_gives_the_same_value():
    import pandas as pd

    from rankcollapse.experiments import claims as C

    new = {"stat": "envelope_rate", "n_tokens": 16, "select": {"mask_spec": "causal"}}
    old = {"stat": "envelope_rate", "n": 16, "select": {"mask_spec": "causal"}}
    value = _no_warning(lambda: C.quantity(pd.DataFrame(), new).point)
    with pytest.warns(FutureWarning, match=r"quantity\.n is deprecated .* 0\.3\.0; use n_tokens"):
        assert C.quantity(pd.DataFrame(), old).point == value


def test_schedule_study_old_d_warns():
    from rankcollapse.experiments.schedules import _read_study

    new = _read_study()
    assert new["simulation"]["d_model"] == 16
    old = copy.deepcopy(new)
    old["simulation"]["d"] = old["simulation"].pop("d_model")
    with pytest.warns(FutureWarning, match=r"schedules\.simulation\.d is deprecated .* 0\.3\.0; use d_model"):
        assert validate_study(old) == _no_warning(lambda: validate_study(new))


def test_stored_run_config_reads_silently():
    """A committed run written before the rename (old keys in its config.json) is read
    under the new names without a warning (recheck, report)."""
    stored = json.loads((RESULTS / "quick" / "config.json").read_text())
    assert stored["data"] == {"corpus": "wikipedia", "length": 128, "seed": 0}  # written before the rename
    cfgs = _no_warning(lambda: [keys.current_config(c, warn=False) for c in stored["configs"]])
    assert [c["data"]["n_tokens"] for c in cfgs] == [128] * len(cfgs)
    assert keys.stored_run({**stored, "configs": cfgs})["configs"] == stored["configs"]


@pytest.mark.parametrize("data", [{"corpus": "wikipedia", "n_tokens": 128, "seed": 0},
                                  {"corpus": "wikipedia", "length": 128, "seed": 0}])  # a run written before the rename
def test_report_header_names_the_window_length(data):
    from types import SimpleNamespace

    from rankcollapse.experiments.report import header_fields

    result = SimpleNamespace(config={"data": data, "experiments": ["fig3"], "scale": "smoke", "config_hash": "x",
                                     "seed": 0, "overrides": {}}, claims=[], seconds=1.0)
    assert dict(header_fields(result))["Input"] == "wikipedia, windows of 128 tokens, data seed 0"
