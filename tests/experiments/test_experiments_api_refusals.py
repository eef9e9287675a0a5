"""Bad arguments to the experiment API end in a typed error (a RankCollapseError
subclass naming the argument), never a bare ValueError or FileNotFoundError."""

import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import runner


@pytest.mark.parametrize("kw, text", [
    (dict(seed=0, overrides={"depth": "abc"}), r"overrides\['depth'\] must be an integer"),
    (dict(seed=0, overrides={"depth": 0}), r"overrides\['depth'\] must be an integer >= 1"),
    (dict(seed=0, overrides={"n_samples": 2.5}), r"overrides\['n_samples'\] must be an integer"),
    (dict(seed="x"), "^seed must be an integer"),
    (dict(seed=-1), "^seed must be an integer >= 0"),
])
def test_plan_refuses_bad_overrides_and_seeds(kw, text):
    with pytest.raises(ConfigError, match=text):
        runner.plan("main", "smoke", **kw)


def test_plan_accepts_integer_overrides():
    _, units, _ = runner.plan("main", "smoke", 0, overrides={"depth": 3, "n_samples": 2})
    sims = [u for u in units if u.kind == "simulate"]
    assert sims and all(u.params["n_samples"] == 2 for u in sims)


def test_recheck_of_a_missing_or_unfinished_folder(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        runner.recheck(tmp_path / "absent")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="no claims.json"):
        runner.recheck(tmp_path)


@pytest.mark.parametrize("overrides, key", [({"n_sample": 3}, "n_sample"), ({"colour": "red"}, "colour")])
def test_plan_refuses_an_unknown_override_key(overrides, key):
    # a dropped key would run the default units while the caller believes otherwise
    with pytest.raises(ConfigError, match=rf"unknown key '{key}'; accepted keys: masks, depth, n_samples, extra_models"):
        runner.plan("main", "smoke", 0, overrides=overrides)


def test_old_override_key_warning_points_at_the_caller():
    with pytest.warns(FutureWarning, match="n_windows") as caught:
        runner.plan("fig3", "smoke", 0, overrides={"n_windows": 2})
    assert [w.filename for w in caught if "n_windows" in str(w.message)] == [__file__]


@pytest.mark.parametrize("name, text, msg", [
    ("config.json", "[1, 2]", "is not the config.json of a run"),
    ("config.json", "{\"configs\": [1], \"scale\": \"smoke\"}", "is not the config.json of a run"),
    ("claims.json", "{\"C01\": 1}", "is not the claims.json of a run"),
    ("claims.json", "[{\"id\": \"Z99\", \"verdict\": \"supported\"}]", "names claims its config.json does not define"),
    ("config.json", "{", "is not valid JSON"),
    ("table.parquet", "not parquet", "is not a readable table of a run"),
])
def test_recheck_of_a_run_folder_whose_records_are_not_a_runs(tmp_path, name, text, msg):
    # the folder is input: a config.json that is a list was a TypeError
    files = {"config.json": '{"configs": [], "scale": "smoke"}', "claims.json": "[]", "table.parquet": ""}
    for n, t in {**files, name: text}.items():
        (tmp_path / n).write_text(t)
    if name != "table.parquet":
        import pandas as pd

        pd.DataFrame({"layer": [0], "seed": [0], "depth": [1]}).to_parquet(tmp_path / "table.parquet")
    with pytest.raises(ConfigError, match=msg):
        runner.recheck(tmp_path)
