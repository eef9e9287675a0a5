"""The power-method experiment: the constructed value matrix, the power_method unit's rows
through a smoke run of `reproduce power`, refusals, and the claims' reading of alignment and tilt."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import claims as C
from rankcollapse.experiments.config import load_config
from rankcollapse.experiments.power_units import run_power_method, spectrum_variant, value_spectrum_matrix
from rankcollapse.experiments.table import rows_from_metrics
from rankcollapse.metrics.power import principal_eigenvector
from rankcollapse.sweep.units import Unit
from tests.cli._harness import run_cli


def test_constructed_value_matrix_has_the_stated_spectrum():
    """W_V = Q diag(rest, 1, second, rest, ...) Q^T, Q's first column 1/sqrt(d): v1 = Q[:, 1]
    is orthogonal to (1, ..., 1), the direction LayerNorm removes."""
    d = 7
    W = value_spectrum_matrix(d, -0.5, 0.25, seed=3)
    torch.testing.assert_close(W, W.T)
    lam = torch.linalg.eigvalsh(W)
    torch.testing.assert_close(lam, torch.tensor([-0.5] + [0.25] * 5 + [1.0], dtype=torch.float64))
    ones = torch.full((d,), 1 / math.sqrt(d), dtype=torch.float64)
    torch.testing.assert_close(ones @ W, 0.25 * ones)
    v1, ratio = principal_eigenvector(W)
    assert abs(float(v1[0] @ ones)) < 1e-12 and ratio == pytest.approx(0.5, rel=1e-12)
    assert spectrum_variant(-1, 0.25) == "l2=-1.0,rest=0.25"
    with pytest.raises(ConfigError, match="at least 3"):
        value_spectrum_matrix(2, 0.5, 0.25, seed=0)


@pytest.mark.parametrize("params, match", [({"network": "recurrent"}, "network must be"),
                                           ({"norm": "rmsnorm"}, "norm must be")])
def test_bad_parameters_are_refused(params, match):
    p = {"network": "simulator", "second": 0.5, "rest": 0.25, "d_model": 4, "n_tokens": 4, "n_samples": 2,
         "depth": 2, "seed": -1, "setting": "default", **params}
    with pytest.raises(ConfigError, match=match):
        run_power_method(Unit("power_method", p, "power"), None)


def test_simulator_units_of_the_smoke_plan():
    """The simulator units of `reproduce power --scale smoke`, computed one by one: 4
    inputs, depth 16, one v1 per layer, and the mean tilt (a(X_16) - a(X_0)) / 16 window
    by window."""
    from rankcollapse.experiments import runner

    _, units, _ = runner.plan("power", "smoke", 0)
    sim = [u for u in units if u.kind == "power_method" and u.params["network"] == "simulator"]
    assert sim
    table = pd.concat([run_power_method(u, None) for u in sim], ignore_index=True)
    assert set(table["model"]) == {"gaussian"} and set(table["norm"]) == {"sphere", "layernorm"}
    align = table[table["metric"] == "v1_alignment"]
    assert sorted(set(align["layer"])) == list(range(17))
    assert set(table["n_samples"]) == {4} and set(table["dtype"]) == {"float64"}
    for variant, g in table.groupby(["norm", "variant"]):
        a = g[g["metric"] == "v1_alignment"].set_index("layer")["values"]
        tilt = g[g["metric"] == "v1_tilt_mean"]
        assert list(tilt["layer"]) == [16]
        np.testing.assert_allclose(tilt["values"].iloc[0], (np.asarray(a[16]) - np.asarray(a[0])) / 16,
                                   atol=1e-15, err_msg=str(variant))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """`reproduce power --scale smoke` through the CLI: 4 inputs and windows, depth 16."""
    root = tmp_path_factory.mktemp("power")
    proc = run_cli("reproduce", "power", "--scale", "smoke", "--out", str(root / "run"), "--cache-dir",
                   str(root / "cache"), "--no-progress", cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root / "run"


@pytest.mark.slow  # a whole run with MiniLM and ALBERT: CI runs it with the slow tests
def test_smoke_run_rows_and_claims(smoke_run):
    table = pd.read_parquet(smoke_run / "table.parquet")
    assert set(table["source"]) == {"power_method"}
    assert set(table["model"]) == {"gaussian", "minilm", "albert"}
    sim = table[(table["model"] == "gaussian") & (table["metric"] == "v1_alignment")]
    assert sorted(set(sim["layer"])) == list(range(17)) and set(sim["norm"]) == {"sphere", "layernorm"}
    assert set(sim["n_samples"]) == {4} and set(sim["dtype"]) == {"float64"}
    # one v1 for every layer: the mean tilt is (a(X_16) - a(X_0)) / 16, window by window
    for variant, g in table[table["model"] == "gaussian"].groupby(["norm", "variant"]):
        a = g[g["metric"] == "v1_alignment"].set_index("layer")["values"]
        tilt = g[g["metric"] == "v1_tilt_mean"]
        assert list(tilt["layer"]) == [16]
        np.testing.assert_allclose(tilt["values"].iloc[0], (np.asarray(a[16]) - np.asarray(a[0])) / 16,
                                   atol=1e-15, err_msg=str(variant))
    minilm = table[(table["model"] == "minilm") & (table["metric"] == "v1_tilt")]
    assert sorted(set(minilm["layer"])) == list(range(1, 7))
    assert set(minilm["value"]) == {"pretrained", "random_init"}
    assert set(minilm["variant"]) == {"v1", "random_direction"}
    dims = table[(table["metric"] == "v1_dim") & (table["variant"] == "v1")]["mean"]
    assert set(dims) <= {1.0, 2.0}
    claims = {c["id"]: c for c in json.loads((smoke_run / "claims.json").read_text())}
    assert list(claims) == ["P1", "P2", "P3"]
    assert claims["P1"]["verdict"] == "reproduced"  # lambda_2 = 0.5: 0.5^16 of v2 is left
    for c in claims.values():
        assert c["controls_ok"], c["id"]


def _rows(model: str, value: str, variant: str, norm: str, align: np.ndarray, tilt: float) -> pd.DataFrame:
    """v1_alignment ``align`` (L + 1 layers) and v1_tilt_mean ``tilt`` at layer L, four windows
    spread by +-1 %."""
    spread = np.linspace(0.99, 1.01, 4)
    labels = {"source": "power_method", "model": model, "value": value, "variant": variant, "norm": norm,
              "mask": "complete", "mask_spec": "complete", "dtype": "float64", "depth": -1}
    L = len(align) - 1
    return pd.concat([rows_from_metrics({"v1_alignment": align[:, None] * spread}, labels),
                      rows_from_metrics({"v1_tilt_mean": np.array([[tilt]]) * spread}, labels, layers=[L])],
                     ignore_index=True)


def _table(present: bool) -> pd.DataFrame:
    """P1: lambda_2 = 0.5 aligned (1.0) or not (0.6); the trained MiniLM and ALBERT tilting by
    0.05 or 0. Controls' rows as constructed (lambda_2 = 0.1 aligned, the reflection not)."""
    parts = []
    sim = {"l2=0.5,rest=0.25": 1.0 if present else 0.6, "l2=-1.0,rest=0.25": 0.6, "l2=0.9,rest=0.25": 0.99,
           "l2=0.99,rest=0.25": 0.7, "l2=0.1,rest=0.05": 1.0, "l2=-1.0,rest=-1.0": 0.16}
    for norm in ("sphere", "layernorm"):
        for variant, end in sim.items():
            align = np.linspace(0.2, end, 17)
            parts.append(_rows("gaussian", "constructed", variant, norm, align, (end - 0.2) / 16))
    tilt = 0.05 if present else 0.0
    for model, value, t in (("minilm", "pretrained", tilt), ("minilm", "random_init", 0.0), ("albert", "random_init", tilt)):
        parts.append(_rows(model, value, "v1", "", np.linspace(0.05, 0.05 + 6 * t, 7), t))
        parts.append(_rows(model, value, "random_direction", "", np.full(7, 0.04), 0.0))
    return pd.concat(parts, ignore_index=True)


@pytest.mark.parametrize("present", [True, False])
def test_rules_pass_when_present_and_fail_when_absent(present):
    table = _table(present)
    for claim in load_config("power")["claims"]:
        res = C.evaluate_claim(table, claim, n_boot=200)
        assert C.registered_verdict(res) == ("reproduced" if present else "not reproduced"), claim["id"]
