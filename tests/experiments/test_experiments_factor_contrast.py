"""C02 ("Add LayerNorm: helped") read on its factor-off arm in the committed quick run:
pure SA without LayerNorm at the logit scale of real LayerNorm (d_qk = (100.8 / 384)^2),
on the same masks, weights, inputs, depth and seeds."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rankcollapse.experiments import claims as C
from rankcollapse.experiments.config import load_config
from rankcollapse.experiments.table import normalise

QUICK = Path(__file__).parents[2] / "docs" / "results" / "quick"
MATCHED_DQK = 0.06890625


@pytest.fixture(scope="module")
def quick():
    table = normalise(pd.read_parquet(QUICK / "table.parquet"))
    (claim,) = [c for c in load_config("fig2")["claims"] if c["id"] == "C02"]
    stored = {c["id"]: c for c in json.loads((QUICK / "claims.json").read_text())}["C02"]
    return table, claim, stored


def _mean_sq_row_norm(table, layer, **select):
    """Mean over windows and seeds of ||X||_F^2 / N at ``layer``, from mu and mu / ||X||_F."""
    rows = table[(table["layer"] == layer) & (table["setting"] == "default") & (table["source"] == "simulate")]
    for k, v in select.items():
        rows = rows[np.isclose(rows[k], v)] if isinstance(v, float) else rows[rows[k] == v]
    mu = rows[rows["metric"] == "mu"].sort_values("seed")["values"]
    rel = rows[rows["metric"] == "mu_relative"].sort_values("seed")["values"]
    assert len(mu) == len(rel) == 2
    return float(np.mean([np.mean((np.asarray(a) / np.asarray(b)) ** 2 / 128) for a, b in zip(mu, rel)]))


def test_the_factor_off_arm_is_pure_sa_at_the_logit_scale_of_real_layernorm(quick):
    table, claim, _ = quick
    off = C.factor_off_rule(claim["rule"], claim["factor"])
    scored = [c for c in off["checks"] if not c.get("informational")]
    assert len(scored) == 8
    for c in scored:
        sel = c["lhs"]["select"]
        assert sel["variant"] == "pure" and sel["d_qk"] == MATCHED_DQK and sel["sphere_radius"] == 1.0
        assert "norm" not in sel
    # logit scale = mean squared row norm / sqrt(d_qk): real LayerNorm's rows hold d = 384
    # from layer 1 on (d_qk = 1); the matched arm's input rows 100.8, over sqrt(0.0689) = 0.2625
    for mask in ("complete", "causal", "sliding_window:w=9", "causal_sliding_window:w=9"):
        ln = _mean_sq_row_norm(table, 4, variant="layernorm", mask_spec=mask, d_qk=1.0)
        pure = _mean_sq_row_norm(table, 0, variant="pure", mask_spec=mask, d_qk=MATCHED_DQK)
        assert ln == pytest.approx(384, rel=1e-3) and pure / np.sqrt(MATCHED_DQK) == pytest.approx(ln, rel=2e-3)


def test_c02s_rule_on_the_matched_pure_sa_arm(quick):
    """The rule itself, run on the arm without LayerNorm: no check C02 counts holds there
    (so none of C02's is carried by what pure SA does as well), and the bidirectional window,
    the one mask where LayerNorm is undecided, is undecided without it at the same rate: the
    window's slow mixing, not LayerNorm."""
    table, claim, stored = quick
    off = C.factor_off_rule(claim["rule"], claim["factor"])
    res = C.evaluate_claim(table, {"id": "C02", "rule": off}, depth=32, n_tokens=128)
    scored = [c for c in res["checks"] if not c.get("informational")]
    assert all(c["outcome"] in ("fails", "undecided") for c in scored)
    assert C.registered_verdict(res) in ("not reproduced", C.NOT_WHERE_DECIDABLE)
    by_check = {c["check"]: c for c in stored["checks"]}
    for c in scored:  # the arm the committed record was decided against is this one
        assert by_check[c["check"]]["factor_off"]["value"] == pytest.approx(c["value"], rel=1e-12)
        assert by_check[c["check"]]["factor_off"]["outcome"] == c["outcome"]
    window = [c for c in scored if c["check"].endswith("[mask=sliding_window:w=9]")]
    assert len(window) == 2 and all(c["outcome"] == "undecided" for c in window)
    on = [k for k in stored["checks"] if k["check"].endswith("[mask=sliding_window:w=9]") and not k.get("informational")]
    assert all(abs(k["value"] - k["factor_off"]["value"]) < 0.001 for k in on)
    assert not any(k["outcome"] == C.FACTOR_OFF_PASSES for k in stored["checks"])
    assert not any(k["outcome"] == "holds" for k in stored["checks"] if not k.get("informational"))
