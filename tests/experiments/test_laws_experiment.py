"""The temperature-law experiment: the temperature_law, temperature_switch and gap_count units' rows (layer = log10 N, the
per-query values kept, its labels), refusals, and the claims' reading of a growth factor."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import claims as C
from rankcollapse.experiments.table import rows_from_metrics
from rankcollapse.experiments.config import load_config
from rankcollapse.experiments.temperature_units import law_variant, run_temperature_law, temperature_law_rows
from rankcollapse.sweep.units import Unit

PARAMS = {"law": "log:0", "d_model": 3, "n_tokens": [10, 100], "n_queries": 4, "keys": "sphere", "query": "fresh",
          "draw_seed": 0}


def test_rows_are_one_per_decade_with_every_query():
    """β = 0 (log:0): uniform attention, PR = N exactly for every query."""
    rows = temperature_law_rows(PARAMS)
    assert list(rows["layer"]) == [1, 2] and list(rows["point"]) == ["n_tokens.10", "n_tokens.100"]
    assert set(rows["metric"]) == {"participation_ratio"}
    for n, vals, mean in zip((10, 100), rows["values"], rows["mean"]):
        np.testing.assert_allclose(vals, np.full(4, float(n)), rtol=1e-12)
        assert mean == pytest.approx(n, rel=1e-12)


def test_unit_labels():
    df = run_temperature_law(Unit("temperature_law", {**PARAMS, "seed": -1, "setting": "default"}, "laws"), None)
    assert set(df["variant"]) == {"log:0.0,d=3"} and set(df["source"]) == {"temperature_law"}
    assert set(df["model"]) == {"sphere"} and set(df["dtype"]) == {"float64"} and set(df["mask_spec"]) == {"complete"}
    assert law_variant("pow:1", 5) == "pow:1.0,d=5"


def test_n_tokens_not_a_power_of_ten_is_refused():
    with pytest.raises(ConfigError, match="powers of 10"):
        temperature_law_rows({**PARAMS, "n_tokens": [10, 300]})


def test_claim_thresholds_are_the_stated_exponents():
    claims = {c["id"]: c for c in load_config("laws")["claims"]}
    (l1,) = claims["L1"]["rule"]["checks"]
    (l2,) = claims["L2"]["rule"]["checks"]
    assert math.log10(l1["factor"]) == pytest.approx(0.1) and l1["op"] == "within"
    assert math.log10(l2["rhs"]["const"]) == pytest.approx(0.5) and l2["op"] == ">="


def _table(growth: dict[str, float]) -> pd.DataFrame:
    """Rows of every law the claims read: mean PR = 2 growth^(k - 3) at layer k = log10 N,
    eight queries spread by +-1 %."""
    spread = np.linspace(0.99, 1.01, 8)
    parts = []
    for law in ("log:0.0", "log:1.0", "pow:1.0", "pow:10.0", "ssmax:1.0", "llama4"):
        for d in (3, 5):
            g = growth[law]
            vals = np.array([2.0 * g ** (k - 3) for k in (3, 4, 5)])[:, None] * spread
            parts.append(rows_from_metrics({"participation_ratio": vals},
                                           {"source": "temperature_law", "variant": f"{law},d={d}", "mask": "complete",
                                            "mask_spec": "complete", "model": "sphere", "dtype": "float64", "depth": -1},
                                           layers=[3, 4, 5]))
    return pd.concat(parts, ignore_index=True)


@pytest.mark.parametrize("present", [True, False])
def test_rules_pass_when_present_and_fail_when_absent(present):
    """Present: pow laws flat, logarithmic laws x7 per decade. Absent: the other way round."""
    flat, grows = 1.0, 7.0
    law = {"log:0.0": 10.0, "pow:10.0": 1.0}
    law.update({k: (flat if present else grows) for k in ("pow:1.0",)})
    law.update({k: (grows if present else flat) for k in ("log:1.0", "ssmax:1.0", "llama4")})
    table = _table(law)
    for claim in [c for c in load_config("laws")["claims"] if c["id"] in ("L1", "L2")]:
        res = C.evaluate_claim(table, claim, n_boot=200)
        assert C.registered_verdict(res) == ("reproduced" if present else "not reproduced"), claim["id"]


# ------------------------------------------------------------------ L3: the collapse switch
SWITCH = {"law": "log", "grid": [1.0, 1.5, 2.0, 2.5], "n_tokens": [256, 1024], "tokens": "exact", "rho": 0.5}


def test_switch_rows_of_exact_tokens():
    """Exactly equiangular tokens (closed form): one value per N at layer log2 N; the distance
    is |γ* - 2| / 2, and γ* rises towards 2 with N."""
    from rankcollapse.experiments.temperature_units import run_temperature_switch

    df = run_temperature_switch(Unit("temperature_switch", {**SWITCH, "seed": -1, "setting": "default"}, "laws"), None)
    star = df[df["metric"] == "gamma_switch"].sort_values("layer")
    dist = df[df["metric"] == "gamma_distance"].sort_values("layer")
    assert list(star["layer"]) == [8, 10] and set(df["variant"]) == {"log,d=inf"} and set(df["model"]) == {"exact"}
    assert all(len(v) == 1 for v in star["values"])
    np.testing.assert_allclose(dist["mean"], np.abs(star["mean"].to_numpy() - 2) / 2, rtol=1e-12)
    assert 1.7 < star["mean"].iloc[0] < star["mean"].iloc[1] < 2.0


def test_switch_n_tokens_not_a_power_of_two_is_refused():
    from rankcollapse.experiments.temperature_units import temperature_switch_rows

    with pytest.raises(ConfigError, match="powers of 2"):
        temperature_switch_rows({**SWITCH, "n_tokens": [256, 1000]})


def _switch_table(distance: dict[str, list[float]]) -> pd.DataFrame:
    """gamma_distance rows at layers 8..11 per (model, variant), four inputs spread by +-1 %."""
    spread = np.linspace(0.99, 1.01, 4)
    parts = []
    for key, dist in distance.items():
        model, variant = key.split("|")
        vals = np.asarray(dist)[:, None] * spread
        parts.append(rows_from_metrics({"gamma_distance": vals}, {"source": "temperature_switch", "model": model,
                                                                  "variant": variant, "mask": "complete",
                                                                  "mask_spec": "complete", "dtype": "float64",
                                                                  "depth": -1}, layers=[8, 9, 10, 11]))
    return pd.concat(parts, ignore_index=True)


@pytest.mark.parametrize("present", [True, False])
def test_switch_rule_passes_when_gamma_approaches_2_and_fails_when_not(present):
    """Present: the distance falls like 1/ln N to 0.065. Absent: it stays at 0.2."""
    approach = [0.5 / (k * math.log(2)) for k in (8, 9, 10, 11)]
    table = _switch_table({"simplex|log,d=64": approach if present else [0.2] * 4,
                           "exact|log,d=inf": approach, "simplex|pow,d=64": [3.2, 3.6, 4.1, 4.6]})
    (claim,) = [c for c in load_config("laws")["claims"] if c["id"] == "L3"]
    res = C.evaluate_claim(table, claim, n_boot=200)
    assert C.registered_verdict(res) == ("reproduced" if present else "not reproduced")


# ------------------------------------------------------------------ L4: the gap count of real rows
def test_gap_count_rows_of_exponential_rows():
    """Attention rows whose logits have gaps u_(k) = ln k / a (n(g) = e^{a g}): the model
    variant's rate is a and its exponential fit exact; the synthetic variants share the
    rows' shapes; layers are k + 1."""
    from rankcollapse.experiments.temperature_units import gap_count_rows

    N, a = 64, 2.0
    z = -torch.log(torch.arange(1, N + 1, dtype=torch.float64)) / a
    A = torch.softmax(z, -1).expand(2, 3, N, N).to(torch.float32)  # (B, H, N, N)
    df = gap_count_rows({"layer.0.attention": A, "layer.1.attention": A})
    model = df[df["variant"] == "model"].set_index(["metric", "layer"])["mean"]
    assert model[("gap_rate", 1)] == pytest.approx(a, rel=1e-4) and model[("gap_r2_exp", 2)] == pytest.approx(1, abs=1e-6)
    assert set(df["variant"]) == {"model", "gaussian", "uniform"} and set(df["layer"]) == {1, 2}
    assert all(len(v) == 2 for v in df["values"])  # one value per window


def test_gap_count_rows_under_a_causal_mask_fit_only_rows_with_every_point():
    """Causal rows: the queries with more than 32 keys have exponential gaps (rate a, exact
    fit), the shorter ones power-like gaps. Under the causal mask only the former are fit;
    read as complete, the short rows would enter and move the rate."""
    from rankcollapse.experiments.temperature_units import gap_count_rows

    N, a = 40, 2.0
    k = torch.arange(1, N + 1, dtype=torch.float64)
    z = torch.full((N, N), -math.inf, dtype=torch.float64)
    for i in range(N):
        gaps = torch.log(k[: i + 1]) / a if i >= 32 else 0.05 * (k[: i + 1] - 1) ** 2  # u_(1) = 0: the maximum
        z[i, : i + 1] = -gaps.flip(0)  # the largest logit on the latest key
    A = torch.softmax(z, -1).expand(2, 3, N, N).to(torch.float32)  # (B, H, N, N), 0 beyond the query
    maps = {"layer.0.attention": A}
    causal = gap_count_rows(maps, mask="causal")
    model = causal[causal["variant"] == "model"].set_index("metric")["mean"]
    assert model["gap_rate"] == pytest.approx(a, rel=1e-4) and model["gap_r2_exp"] == pytest.approx(1, abs=1e-6)
    complete = gap_count_rows(maps)
    rate = complete[(complete["variant"] == "model") & (complete["metric"] == "gap_rate")]["mean"].item()
    assert abs(rate - a) > 0.1 * a


def test_gap_count_rows_give_no_rate_for_rows_equal_to_round_off():
    """Head 1 exactly uniform (float32 1/N: every logit equal, its float64 std round-off of
    the mean, not 0): no rate in any variant, instead of the synthetic rows' 1 / round-off
    (~1e15); head 0's exponential rows keep their numbers, which are then the mean."""
    from rankcollapse.experiments.temperature_units import gap_count_rows

    N, a = 48, 2.0
    z = -torch.log(torch.arange(1, N + 1, dtype=torch.float64)) / a
    A = torch.softmax(z, -1).expand(1, 2, N, N).to(torch.float32).clone()  # (B, H, N, N)
    A[:, 1] = 1.0 / N
    rate = gap_count_rows({"layer.0.attention": A}).query("metric == 'gap_rate'").set_index("variant")["mean"]
    alone = gap_count_rows({"layer.0.attention": A[:, :1]}).query("metric == 'gap_rate'").set_index("variant")["mean"]
    assert rate["model"] == pytest.approx(a, rel=1e-4) and rate["model"] == alone["model"]
    assert 1 < rate["gaussian"] < 10 and 1 < rate["uniform"] < 10  # Gaussian and uniform logits of spread ~0.4


def test_gap_count_rows_without_a_full_row_are_refused():
    from rankcollapse.experiments.temperature_units import gap_count_rows

    A = torch.full((1, 1, 32, 32), 1 / 32)
    with pytest.raises(ConfigError, match="more than 32 keys"):
        gap_count_rows({"layer.0.attention": A})


def _gap_table(advantage: dict[str, float], model: str = "minilm", layers: int = 6) -> pd.DataFrame:
    spread = np.linspace(0.9, 1.1, 8)
    parts = []
    for variant, adv in advantage.items():
        metrics = {"gap_fit_advantage": np.full((layers, 1), adv) * spread, "gap_rate": np.full((layers, 8), 1.0)}
        parts.append(rows_from_metrics(metrics, {"source": "gap_count", "model": model, "variant": variant,
                                                 "value": "pretrained", "mask": "complete", "mask_spec": "complete",
                                                 "dtype": "float32", "depth": -1}, layers=list(range(1, layers + 1))))
    return pd.concat(parts, ignore_index=True)


@pytest.mark.parametrize("cid, model, layers", [("L4", "minilm", 6), ("L5", "smollm2", 30)])
@pytest.mark.parametrize("present", [True, False])
def test_gap_rule_passes_when_exponential_and_fails_when_power(present, cid, model, layers):
    """L4 (MiniLM) and L5 (SmolLM2) read their own model's rows at each of its layers, with
    the same threshold; the other model's rows do not enter."""
    other = _gap_table({"model": -0.05 if present else 0.05}, "smollm2" if model == "minilm" else "minilm", 30)
    table = pd.concat([_gap_table({"model": 0.05 if present else -0.05, "gaussian": 0.06, "uniform": -0.07},
                                  model, layers), other], ignore_index=True)
    (claim,) = [c for c in load_config("laws")["claims"] if c["id"] == cid]
    (check, *_) = claim["rule"]["checks"]
    assert check["for_each"]["layer"] == list(range(1, layers + 1)) and check["rhs"] == {"const": 0.01}
    res = C.evaluate_claim(table, claim, n_boot=200)
    assert C.registered_verdict(res) == ("reproduced" if present else "not reproduced")


@pytest.mark.slow  # a whole run or fresh processes: CI runs it with the slow tests
def test_smoke_run_through_the_cli(tmp_path):
    """`reproduce laws --scale smoke` end to end: L1-L4, each with its controls passing,
    L5 not run (smoke leaves SmolLM2 out), the switch rows at N = 2^8 and 2^9 only and the
    gap rows of MiniLM and its random-init control."""
    import json

    from tests.cli._harness import run_cli

    out = tmp_path / "run"
    res = run_cli("reproduce", "laws", "--scale", "smoke", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                  "--no-progress", "--no-nearby")
    assert res.returncode == 0, res.stderr
    claims = {c["id"]: c for c in json.loads((out / "claims.json").read_text())}
    assert sorted(claims) == ["L1", "L2", "L3", "L4", "L5"] and claims.pop("L5")["verdict"] == "not run"
    assert all(c["controls_ok"] for c in claims.values()), {k: c["controls"] for k, c in claims.items()}
    table = pd.read_parquet(out / "table.parquet")
    assert set(table.loc[table["source"] == "temperature_switch", "layer"]) == {8, 9}
    gaps = table[table["source"] == "gap_count"]
    assert set(gaps["model"]) == {"minilm"} and set(gaps["value"]) == {"pretrained", "random_init"}
    assert set(gaps["layer"]) == set(range(1, 7))
