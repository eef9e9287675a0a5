"""`rankcollapse simulate` through the CLI: in-process, and once through the real entry
point in a fresh interpreter."""

import json
import subprocess
import sys

import pytest

from tests.cli._harness import run_cli

CMD = [sys.executable, "-c", "from rankcollapse.cli import main; main()", "simulate"]


def run(*args):
    return run_cli("simulate", *args)


def test_json_layers_and_plot(tmp_path):
    p = run("--mask", "causal", "--n-tokens", "16", "--depth", "5", "--n-samples", "3", "--value", "orthogonal",
            "--d-model", "8", "--seed", "1", "--format", "json", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [row["layer"] for row in doc["layers"]] == list(range(6)) and "t" not in doc["layers"][0]
    assert [row["point"] for row in doc["layers"]][:2] == ["embeddings", "layer.0.output"]
    assert doc["settings"]["mask"] == "causal" and doc["settings"]["depth"] == 5
    mus = [row["mu"] for row in doc["layers"]]
    assert all(b < a for a, b in zip(mus, mus[1:]))  # QSC mask, orthogonal W_V: μ falls
    assert 0 < doc["layers"][-1]["mu_relative"] < 1
    assert (tmp_path / "mu_loglog.png").stat().st_size > 1000
    assert json.loads((tmp_path / "result.json").read_text())["layers"] == doc["layers"]
    again = run("--mask", "causal", "--n-tokens", "16", "--depth", "5", "--n-samples", "3", "--value", "orthogonal",
                "--d-model", "8", "--seed", "1", "--format", "json")
    assert json.loads(again.stdout)["layers"] == doc["layers"]


@pytest.mark.parametrize("args, msg", [
    (["--d-qk", "-1"], "--d-qk must be > 0"),
    (["--heads", "3", "--d-model", "8"], "n_heads=3 does not divide d_model=8"),
    (["--mask", "nosuchmask"], "nosuchmask"),
    (["--input", "/nonexistent.npy"], "neither one of"),
    (["--variant", "sphere", "--placement", "none", "--alpha", "1"], "placement 'none' has no skip"),
    (["--device", "nosuchdevice"], "not a torch device"),
    (["--device", "cuda:99"], "not available"),
    (["--seed", "-1"], "seed must be an integer >= 0"),
    (["--input", "BADFILE"], "not a readable .npy array"),
])
def test_bad_input_one_line_exit_2(args, msg, tmp_path, monkeypatch, capsys):
    from rankcollapse.cli import main

    (tmp_path / "bad.npy").write_bytes(b"not an array")
    args = [str(tmp_path / "bad.npy") if a == "BADFILE" else a for a in args]
    monkeypatch.setattr(sys, "argv", ["rankcollapse", "simulate", *args, "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_settings_name_the_variant_and_plot_draws_requested_metrics(tmp_path):
    p = run("--mask", "causal", "--n-tokens", "8", "--depth", "3", "--n-samples", "2", "--d-model", "4",
            "--variant", "sphere", "--metrics", "avg_abs_cos", "--format", "json", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["settings"]["variant"] == "sphere" and doc["settings"]["block"]["norm"] == "sphere"
    assert "avg_abs_cos" in doc["layers"][0] and "mu" not in doc["layers"][0]
    assert "No artists with labels" not in p.stderr  # the plot is not empty


def test_pretrained_defaults_to_the_model_width():
    p = run("--mask", "complete", "--n-tokens", "8", "--n-samples", "1", "--model", "minilm", "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["settings"]["d_model"] == 384 and len(doc["layers"]) == doc["settings"]["depth"] + 1


def test_values_at_the_compute_dtype_floor_are_flagged():
    args = ["--mask", "complete", "--n-tokens", "16", "--depth", "30", "--n-samples", "2", "--d-model", "8",
            "--input", "sphere"]
    doc = json.loads(run(*args, "--dtype", "float64", "--format", "json").stdout)
    floor = 2 * (16 + 8) * 2.220446049250313e-16  # the round-off floor model 2 (N + d) eps
    assert doc["floor"] == {"dtype": "float64", "epsilon": 2.220446049250313e-16, "floor": floor, "n_tokens": 16,
                            "d_model": 8, "metrics": ["mu_relative"], "smallest_normal": 2.2250738585072014e-308,
                            "underflow_metrics": ["mu"]}
    flagged = [row["layer"] for row in doc["layers"] if row["at_floor"]]
    assert flagged and all(doc["layers"][t]["mu_relative"] <= floor for t in flagged)
    assert all(row["mu_relative"] > floor for row in doc["layers"] if not row["at_floor"])
    assert doc["layers"][0]["at_floor"] == [] and doc["layers"][-1]["at_floor"] == ["mu_relative"]
    # float32: its own, coarser floor is reached earlier
    doc32 = json.loads(run(*args, "--dtype", "float32", "--format", "json").stdout)
    floor32 = 48 * 1.1920929e-07
    assert doc32["floor"]["epsilon"] == pytest.approx(1.1920929e-07) and doc32["floor"]["floor"] == pytest.approx(floor32)
    first32 = min(row["layer"] for row in doc32["layers"] if row["at_floor"])
    assert doc32["layers"][first32]["mu_relative"] <= floor32 and first32 <= min(flagged)
    table = run(*args, "--dtype", "float64")
    last = table.stdout.strip().splitlines()[-1].split("\t")
    assert last[2].endswith("*") and not last[1].endswith("*")  # mu_relative flagged, absolute mu not
    assert "* at or below the float64 round-off floor 2 (N + d) ε = 1.07e-14 (N = 16, d = 8" in table.stderr


def test_attention_operator_option_reports_row_mass_deficit():
    p = run("--mask", "causal", "--n-tokens", "8", "--depth", "3", "--n-samples", "2", "--d-model", "4",
            "--attention", "offbyone", "--dtype", "float64", "--metrics", "mu_relative,norm_spread", "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["settings"]["block"]["attention"] == "sink:b=0"
    assert "row_mass_deficit_q50" not in doc["layers"][0]
    for row in doc["layers"][1:]:
        assert 0 < row["row_mass_deficit_q05"] <= row["row_mass_deficit_q50"] <= row["row_mass_deficit_q95"] < 1
        assert row["norm_spread"] >= 1


@pytest.mark.parametrize("args, msg", [
    (["--attention", "sink:c=1"], "takes parameters"),
    (["--attention", "offbyone", "--uniform"], "contradict"),
    (["--uniform", "--d-qk", "4"], "--d-qk is ignored by uniform attention"),
    (["--attention", "uniform", "--query-key", "identity"], "--query-key is ignored by uniform attention"),
    (["--attention", "offbyone", "--backend", "blocked"], "--backend 'blocked' cannot run attention"),
    (["--input", "gaussian:std=1,std=2"], "input 'gaussian:std=1,std=2': key 'std' given twice"),
])
def test_attention_operator_errors_are_one_line(args, msg):
    p = run("--n-tokens", "8", "--depth", "2", "--d-model", "4", *args)
    assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr


def test_input_names_come_from_the_registry():
    """Every registry input runs from the CLI, with its keys, and X(0) is the registry's draw (float32)."""
    import torch

    from rankcollapse.dynamics.inputs import make_tokens
    from rankcollapse.metrics import mu

    for name in ("nonnegative", "antipodal", "simplex:rho=0.25"):
        p = run("--mask", "causal", "--n-tokens", "6", "--depth", "1", "--n-samples", "2", "--d-model", "4",
                "--seed", "3", "--input", name, "--format", "json")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["settings"]["input"] == name
        X0 = make_tokens(name, 2, 6, 4, seed=3).to(torch.float32)
        assert doc["layers"][0]["mu"] == pytest.approx(float(mu(X0).mean()), rel=1e-6)


def test_simulate_json_settings_use_the_canonical_keys():
    p = subprocess.run([*CMD, "--mask", "causal", "--n-tokens", "6", "--depth", "1", "--d-model", "4",
                        "--n-samples", "2", "--format", "json"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    settings = json.loads(p.stdout)["settings"]
    assert settings["n_samples"] == 2 and settings["model"] is None
    assert "batch" not in settings and "pretrained" not in settings


def test_a_file_input_gives_n_and_d_and_only_a_contradicting_flag_is_refused(tmp_path):
    """``--input X.npy`` of shape (B, N, d) runs at the file's N and d without ``--n-tokens``
    or ``--d-model``; the same values given explicitly agree; other values are refused."""
    import numpy as np

    from tests.cli._harness import invoke

    X = np.random.default_rng(0).standard_normal((2, 10, 6))
    np.save(tmp_path / "x.npy", X)
    base = ["simulate", "--input", "x.npy", "--mask", "causal", "--depth", "2", "--format", "json"]
    code, out, err = invoke(base, tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["settings"]["n_tokens"] == 10 and doc["settings"]["d_model"] == 6
    import torch

    from rankcollapse.metrics import mu

    assert doc["layers"][0]["mu"] == pytest.approx(float(mu(torch.as_tensor(X, dtype=torch.float32)).mean()), rel=1e-6)
    code, again, err = invoke([*base, "--n-tokens", "10", "--d-model", "6"], tmp_path)
    assert code == 0 and json.loads(again)["layers"] == doc["layers"], err
    code, _, err = invoke([*base, "--n-tokens", "12"], tmp_path)
    assert code == 2 and "N=10" in err and "--n-tokens is 12" in err
    code, _, err = invoke([*base, "--d-model", "8"], tmp_path)
    assert code == 2 and "d=6" in err and "--d-model" in err


SMALL = ["--mask", "causal", "--n-tokens", "16", "--d-model", "8", "--n-samples", "4"]


def test_attention_that_is_not_row_stochastic_shows_the_token_norms_and_a_note():
    """μ/‖X‖_F rises under sigmoid attention while the tokens decay to 0 and one token takes
    over: the default table and JSON show the norms and the row-mass deficit, with notes."""
    p = run(*SMALL, "--depth", "24", "--attention", "sigmoid")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[0].split("\t") == ["layer", "mu", "mu_relative", "token_radius", "max_token_share",
                                    "row_mass_deficit_q50", "epsilon_measured"]
    assert "note: attention sigmoid is not row-stochastic" in p.stderr
    assert "one token holds more than half of ‖X‖_F²" in p.stderr
    assert "the tokens decay towards 0" in p.stderr
    doc = json.loads(run(*SMALL, "--depth", "24", "--attention", "sigmoid", "--format", "json").stdout)
    first, last = doc["layers"][0], doc["layers"][-1]
    assert doc["settings"]["metrics"] == ["mu", "mu_relative", "token_radius", "max_token_share"]
    assert last["token_radius"] < 1.2e-7 * first["token_radius"]  # decayed below the input's rounding
    assert last["max_token_share"] > 0.5 and 0 < last["row_mass_deficit_q50"] < 1
    assert any("one token holds more than half" in n for n in doc["notes"])


def test_row_stochastic_output_stays_compact():
    p = run(*SMALL, "--depth", "4")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0].split("\t") == ["layer", "mu", "mu_relative", "epsilon_measured"]
    assert "note:" not in p.stderr
    doc = json.loads(run(*SMALL, "--depth", "4", "--format", "json").stdout)
    assert "token_radius" not in doc["layers"][0] and doc["notes"] == [] and doc["stopped"] is None


def test_float32_run_that_reaches_the_zero_matrix_keeps_its_layers():
    """The tokens underflow to exactly 0 in float32: the layers measured before are kept,
    the rest are marked (``-`` in the table, null in JSON, ``stopped``), exit status 0."""
    args = [*SMALL, "--depth", "64", "--attention", "sigmoid"]
    doc = json.loads(run(*args, "--format", "json").stdout)
    stop = doc["stopped"]
    assert stop is not None and 1 <= stop["after_layer"] <= 64 and stop["samples"]
    t = stop["after_layer"]
    assert all(row["mu_relative"] is not None for row in doc["layers"][:t])
    assert all(row["mu_relative"] is None and row["token_radius"] is None for row in doc["layers"][t:])
    assert "token_radius" in doc["layers"][t - 1]["at_floor"]  # below float32's smallest normal: underflow
    p = run(*args)
    assert p.returncode == 0, p.stderr
    rows = p.stdout.strip().splitlines()[1:]
    assert len(rows) == 65 and set(rows[t].split("\t")[1:]) == {"-"} and "-" not in rows[t - 1].split("\t")[1:4]
    assert f"after layer {t}: X is the zero matrix" in p.stderr and "--dtype float64 follows" in p.stderr
    assert "underflow" in p.stderr and "Warning" not in p.stderr
    # float64 follows the same run to the end
    doc64 = json.loads(run(*args, "--dtype", "float64", "--format", "json").stdout)
    assert doc64["stopped"] is None and doc64["layers"][-1]["mu_relative"] is not None


def test_attention_too_large_is_refused_before_the_input_is_drawn(tmp_path, monkeypatch, capsys):
    from rankcollapse.cli import main, simulate as cli_simulate

    def never(*args, **kwargs):
        raise AssertionError("X(0) drawn before the attention's memory was checked")

    monkeypatch.setattr(cli_simulate, "_initial_tokens", never)
    monkeypatch.setattr(sys, "argv", ["rankcollapse", "simulate", "--n-tokens", "1000000", "--mask", "complete",
                                      "--depth", "2", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "attention over N = 1000000 tokens" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("given, shown", [(",,", None), ("mu,mu", ["mu"]), (" mu_relative , mu,mu_relative", ["mu_relative", "mu"])])
def test_simulate_metrics_named_once_and_at_least_one(tmp_path, given, shown):
    """``--metrics mu,mu`` showed the column twice and ``--metrics ,,`` printed a table of no metric."""
    from tests.cli._harness import invoke

    code, out, err = invoke(["simulate", "--metrics", given, "--depth", "1", "--n-samples", "1", "--d-model", "4",
                             "--n-tokens", "8", "--format", "json"], tmp_path)
    if shown is None:
        assert code == 2 and err.strip().splitlines() == [
            f"rankcollapse: error: --metrics {given!r} names no metric; e.g. --metrics mu,mu_relative"]
        return
    assert code == 0, err
    assert json.loads(out)["settings"]["metrics"] == shown
