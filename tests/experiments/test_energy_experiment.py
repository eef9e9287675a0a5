"""The energy experiment: the `turn` statistic, the energy unit's derived rows
(contraction per window, the value-output radius per block), the constructed controls,
the claims' reading of synthetic tables, and a smoke run through the CLI."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from cli._harness import run_cli
from rankcollapse.experiments import claims as C
from rankcollapse.experiments.config import load_config
from rankcollapse.experiments.controls import evaluate_controls
from rankcollapse.experiments.energy_controls import (
    CONTROL_RADII, rows_energy_aligned, rows_energy_rising, rows_energy_spread, rows_energy_turning,
)
from rankcollapse.experiments.energy_units import block_radii, energy_rows
from rankcollapse.experiments.table import rows_from_metrics

LABELS = {"source": "energy", "variant": "full", "dtype": "float32"}


def _turn(values, **select) -> C.Value:
    table = rows_from_metrics({"interaction_energy": np.asarray(values, dtype=float)[:, None]}, LABELS)
    return C.quantity(table, {"stat": "turn", "metric": "interaction_energy", "select": select})


def test_turn_is_the_smaller_of_the_largest_rise_and_fall():
    # steps 2, 0.5, 3: largest rise 3, largest fall 1/0.5 = 2
    assert _turn([1.0, 2.0, 1.0, 3.0]).point == pytest.approx(2.0, rel=1e-15)
    # monotone: the largest fall is the smallest rise inverted, below 1
    assert _turn([1.0, 1.25, 2.5, 10.0]).point == pytest.approx(1 / 1.25, rel=1e-15)
    # falling: steps 0.5, 0.75, the largest "rise" is 0.75
    assert _turn([8.0, 4.0, 3.0]).point == pytest.approx(0.75, rel=1e-15)


def test_turn_needs_three_layers():
    with pytest.raises(C.MissingData, match="fewer than 3 layers"):
        _turn([1.0, 2.0])


def test_turn_band_is_measured_from_one():
    check = {"lhs": {"stat": "turn", "metric": "interaction_energy"}, "op": ">=", "rhs": {"const": 1.01}}
    assert C.reference(check) == 1.0
    assert C.band_of(check, 1.01) == pytest.approx([1.005, 1.02])


def _probe_table(mu: np.ndarray, energy: np.ndarray) -> pd.DataFrame:
    """Per-window probe rows (layers 0..L) as ``_probe_per_window`` returns them."""
    L = mu.shape[0] - 1
    points = ["embeddings"] + [f"layer.{k}.output" for k in range(L)]
    return rows_from_metrics({"mu_relative": mu, "interaction_energy": energy}, {}, points=points)


def test_energy_rows_contraction_per_window_and_radius_per_block():
    mu = np.array([[0.9, 0.8], [0.45, 0.8], [0.45, 0.4]])  # (L + 1 = 3, W = 2)
    energy = np.array([[10.0, 12.0], [11.0, 13.0], [12.0, 12.5]])
    rows = energy_rows(_probe_table(mu, energy), [1.5, 0.25])
    c = rows[rows.metric == "contraction"].sort_values("layer")
    assert list(c["layer"]) == [1, 2] and list(c["point"]) == ["layer.0.output", "layer.1.output"]
    np.testing.assert_allclose(np.stack(c["values"]), [[0.5, 1.0], [1.0, 0.5]], rtol=1e-15)
    r = rows[rows.metric == "value_radius"].sort_values("layer")
    np.testing.assert_allclose(np.stack(r["values"]), [[1.5, 1.5], [0.25, 0.25]])
    assert set(rows.metric) == {"mu_relative", "interaction_energy", "contraction", "value_radius"}


def test_value_radius_pairs_with_contraction_in_a_spearman():
    """The radius repeats per window, so the claims' Spearman pairs the two curves."""
    mu = np.array([[1.0, 1.0], [0.5, 0.6], [0.45, 0.5], [0.1, 0.1]])
    rows = energy_rows(_probe_table(mu, np.ones_like(mu)), [1.0, 2.0, 0.5])
    q = {"stat": "spearman", "metric": "contraction", "with": "value_radius", "from_layer": 1, "select": {}}
    # contraction per layer: 0.55, 0.873, 0.206 (means); radii 1, 2, 0.5: same ranks
    assert C.quantity(rows.assign(**LABELS), q).point == pytest.approx(1.0)


def test_constructed_controls_closed_forms():
    def curve(rows, metric):
        return rows[rows.metric == metric].sort_values("layer")["mean"].to_numpy()

    assert np.all(np.diff(curve(rows_energy_rising({}), "interaction_energy")) > 0)
    turning = curve(rows_energy_turning({}), "interaction_energy")
    steps = turning[1:] / turning[:-1]
    assert np.all(steps[:3] < 1 / 1.01) and np.all(steps[3:] > 1.01)
    aligned, spread = rows_energy_aligned({}), rows_energy_spread({})
    np.testing.assert_allclose(curve(aligned, "value_radius"), CONTROL_RADII, rtol=1e-12)
    assert spearmanr(curve(aligned, "contraction"), CONTROL_RADII).statistic == -1.0
    assert spearmanr(curve(spread, "contraction"), CONTROL_RADII).statistic == 1.0
    # aligned: c_l = sqrt((N a^2 + ||R||^2) / (N r^2 a^2 + ||R||^2)) < 1 for r > 1
    assert np.all(curve(aligned, "contraction") < 1) and np.all(curve(spread, "contraction") > 1)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_block_radii_of_the_sum_over_heads_without_biases(family):
    """rho(M_k), M_k = sum_h W_V^h W_O^h from the nn.Linear weights by hand: BERT's full
    heads give value.weight^T dense.weight^T (its biases, set to 1e3, left out exactly);
    Llama's grouped heads (4 query heads on 2 key/value heads) read v_proj's rows of head
    h // 2."""
    import torch
    import transformers as tf

    from rankcollapse.models import as_loaded

    d, heads = 32, 4
    torch.manual_seed(0)
    if family == "bert":
        model = tf.BertModel(tf.BertConfig(vocab_size=97, hidden_size=d, num_hidden_layers=3,
                                           num_attention_heads=heads, intermediate_size=64)).eval()
        pairs = [(b.attention.self.value, b.attention.output.dense) for b in model.encoder.layer]
        for v, o in pairs:
            torch.nn.init.constant_(v.bias, 1e3)
            torch.nn.init.constant_(o.bias, 1e3)
    else:
        model = tf.LlamaModel(tf.LlamaConfig(vocab_size=97, hidden_size=d, intermediate_size=64, num_hidden_layers=3,
                                             num_attention_heads=heads, num_key_value_heads=2)).eval()
        pairs = [(b.self_attn.v_proj, b.self_attn.o_proj) for b in model.layers]
    want = []
    for v, o in pairs:
        V, O = v.weight.detach().double().numpy().T, o.weight.detach().double().numpy().T  # (d, kv d_v), (H d_v, d)
        dv = d // heads
        group = heads // (V.shape[1] // dv)
        M = sum(V[:, (h // group) * dv:(h // group + 1) * dv] @ O[h * dv:(h + 1) * dv] for h in range(heads))
        want.append(np.abs(np.linalg.eigvals(M)).max())
    np.testing.assert_allclose(block_radii(as_loaded(model)), want, rtol=1e-10)


@pytest.mark.parametrize("cid", ["E1", "E2"])
def test_energy_claims_controls_read_as_expected(cid):
    claim = next(c for c in load_config("energy")["claims"] if c["id"] == cid)
    parts = [fn({}).assign(source="theory", model="theory", variant=fn.__name__.removeprefix("rows_"), dtype="float64")
             for fn in (rows_energy_rising, rows_energy_turning, rows_energy_aligned, rows_energy_spread)]
    res = evaluate_controls(pd.concat(parts, ignore_index=True), claim, n_boot=100)
    assert res["positive"]["verdict"] == "reproduced", res["positive"]
    assert res["negative"]["verdict"] == "not reproduced", res["negative"]


def _model_table(energy: dict[str, np.ndarray], contraction: dict[str, np.ndarray], radii: dict[str, np.ndarray]):
    """Rows of both models, trained and random-init: E per layer and contraction/radius, 4
    windows spread by +-0.1 %."""
    spread = np.linspace(0.999, 1.001, 4)
    parts = []
    for model in ("minilm", "smollm2"):
        for value in ("pretrained", "random_init"):
            labels = {**LABELS, "model": model, "value": value}
            parts.append(rows_from_metrics({"interaction_energy": energy[model][:, None] * spread}, labels))
            n = len(radii[model])
            parts.append(rows_from_metrics({"contraction": contraction[model][:, None] * spread,
                                            "value_radius": np.repeat(radii[model][:, None], 4, axis=1)}, labels,
                                           layers=list(range(1, n + 1))))
    return pd.concat(parts, ignore_index=True)


@pytest.mark.parametrize("present", [True, False])
def test_rules_pass_when_present_and_fail_when_absent(present):
    """Present: E rises and falls by 10 % (turn 1.1) and contraction falls as the radius
    grows; absent: E rises by 10 % a layer and contraction rises with the radius."""
    radii = {"minilm": np.array([1.0, 3.0, 2.0, 5.0, 4.0]), "smollm2": np.array([2.0, 1.0, 4.0, 3.0, 6.0])}
    if present:
        energy = {m: np.array([1.0, 1.1, 1.0, 1.1, 1.0, 1.1]) * 1e3 for m in radii}
        contraction = {m: 1.0 - 0.05 * r for m, r in radii.items()}
    else:
        energy = {m: 1e3 * 1.1 ** np.arange(6) for m in radii}
        contraction = {m: 0.7 + 0.05 * r for m, r in radii.items()}
    table = _model_table(energy, contraction, radii)
    for claim in load_config("energy")["claims"]:
        res = C.evaluate_claim(table, claim, n_boot=200)
        assert C.registered_verdict(res) == ("reproduced" if present else "not reproduced"), claim["id"]


def test_smoke_run_through_the_cli(tmp_path):
    """`reproduce energy --scale smoke`: MiniLM and its control (SmolLM2 left out), the
    constructed controls; the claims need SmolLM2, so they are not run, with controls that pass."""
    out = tmp_path / "run"
    done = run_cli("reproduce", "energy", "--scale", "smoke", "--out", str(out), "--cache-dir", str(tmp_path / "c"),
                   "--no-progress")
    assert done.returncode == 0, done.stderr
    table = pd.read_parquet(out / "table.parquet")
    mini = table[(table.source == "energy") & (table.model == "minilm")]
    assert set(mini["value"]) == {"pretrained", "random_init"}
    assert set(mini["metric"]) == {"mu_relative", "interaction_energy", "contraction", "value_radius"}
    e = mini[mini.metric == "interaction_energy"]
    assert sorted(set(e["layer"])) == list(range(7))  # embeddings + 6 blocks
    assert ((e["mean"] > 128**2 / (2 * math.e)) & (e["mean"] < 128**2 * math.e / 2)).all()
    claims = json.loads((out / "claims.json").read_text())
    claims = claims["claims"] if isinstance(claims, dict) else claims
    assert {c["id"]: c["verdict"] for c in claims} == {"E1": "not run", "E2": "not run"}
    assert all(c["controls_ok"] for c in claims)
