"""Bad arguments to the experiment API end in a typed error (a RankCollapseError
subclass naming the argument), never a bare ValueError or FileNotFoundError."""

import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import ExecutionConfig, runner


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


@pytest.mark.parametrize("overrides, key", [({"n_sample": 3}, "n_sample"), ({"colour": "red"}, "colour"),
                                            ({"n_windows": 2}, "n_windows")])
def test_plan_refuses_an_unknown_override_key(overrides, key):
    # a dropped key would run the default units while the caller believes otherwise
    with pytest.raises(ConfigError, match=rf"unknown key '{key}'; accepted keys: masks, depth, n_samples, extra_models"):
        runner.plan("main", "smoke", 0, overrides=overrides)


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


@pytest.mark.parametrize("name, kw, text", [
    ("influence", dict(n_tokens=100000), "n_tokens does not apply to influence at scale smoke"),
    ("influence", dict(text="docs.txt"), "text does not apply to influence at scale smoke"),
    ("geometry", dict(overrides={"masks": ["causal"]}), r"overrides\['masks'\] does not apply to geometry"),
    ("fig3", dict(overrides={"masks": ["causal"]}), r"overrides\['masks'\] does not apply to fig3"),
    ("geometry", dict(overrides={"depth": 3}), r"overrides\['depth'\] does not apply.*it simulates no network"),
    ("power", dict(overrides={"depth": 3}), r"overrides\['depth'\] does not apply.*have a fixed depth"),
    ("influence", dict(overrides={"n_samples": 3}), r"overrides\['n_samples'\] does not apply"),
    ("influence", dict(overrides={"extra_models": ["minilm"]}), r"overrides\['extra_models'\] does not apply"),
])
def test_an_option_no_unit_applies_is_refused_not_recorded(tmp_path, monkeypatch, name, kw, text):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs.txt").write_text("the river city was built near the old stone bridge\n")
    with pytest.raises(ConfigError, match=text):
        runner.plan(name, "smoke", 0, **kw)
    with pytest.raises(ConfigError, match=text):
        runner.run_experiment(name, "smoke", out=tmp_path / "out", **kw, execution=ExecutionConfig(progress=False))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("masks, given", [
    (["causal", "causal"], "('causal' and 'causal')"),
    (["causal", " causal"], "('causal' and ' causal')"),  # was planned and computed twice
    (["block:size=4", "sliding_window:w=3", "block:size=4,causal=false"], "('block:size=4' and 'block:size=4,causal=false')"),
])
def test_a_mask_given_twice_is_refused(tmp_path, masks, given):
    from tests.cli._harness import run_cli

    canonical = "causal" if masks[0] == "causal" else "block:size=4,causal=false"
    message = f"gives the mask {canonical!r} twice {given}; give it once"
    with pytest.raises(ConfigError) as info:
        runner.plan("main", "smoke", 0, overrides={"masks": masks})
    assert str(info.value) == f"overrides['masks'] {message}"
    argv = [a for m in masks for a in ("--mask", m)]
    res = run_cli("reproduce", "main", "--scale", "smoke", "--dry-run", *argv, "--out", "o", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [f"rankcollapse: error: --mask {message}"]


def test_options_a_unit_applies_are_accepted():
    _, units, data = runner.plan("main", "smoke", 0, n_tokens=64, overrides={"masks": ["causal"], "depth": 2})
    assert data["n_tokens"] == 64 and {u.params["mask"] for u in units if u.kind == "simulate"} == {"causal"}
    assert runner.plan("influence", "smoke", 0)[2]["n_tokens"] == runner.DEFAULT_N_TOKENS


def test_the_gap_count_unit_takes_the_text_options(tmp_path):
    """laws' gap_count unit reads MiniLM's windows of the run's text: --text-file,
    --n-tokens and --n-samples apply to it."""
    text = tmp_path / "docs.txt"
    text.write_text("the river city was built near the old stone bridge\n")
    _, units, data = runner.plan("laws", "smoke", 0, text=text, n_tokens=16, overrides={"n_samples": 3})
    gaps = [u for u in units if u.kind == "gap_count"]
    assert data["n_tokens"] == 16 and gaps
    assert {(u.params["data"]["n_tokens"], u.params["n_samples"]) for u in gaps} == {(16, 3)}
