"""The sinks experiment: the phase_sink unit (one phase cell under one weight seed, the
uniform causal row's closed form), the S1 rule on hand-built tables (removes, does not
remove, depends, no sink to remove) and a smoke run through the API deciding S1 and its
controls."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from rankcollapse.experiments import claims as C
from rankcollapse.experiments import run_experiment
from rankcollapse.experiments.config import load_config
from rankcollapse.experiments.controls import evaluate_controls
from rankcollapse.experiments.table import rows_from_metrics
from rankcollapse.phase.batched import run_group
from rankcollapse.phase.grid import expand_grid


def _cell(norm: str, shared: str, depth: int, headwise: str, r: float) -> pd.DataFrame:
    """sink_ratio ``r`` of one cell at its last layer, under two weight seeds (r +- 1 %)."""
    placement = "post_ln" if norm == "layernorm" else "pre_ln"
    labels = {"source": "phase_sink", "model": "gaussian", "mask": "causal", "mask_spec": "causal", "norm": norm,
              "variant": f"{placement},shared={shared},headwise_rmsnorm={headwise}", "depth": depth, "dtype": "float64"}
    return pd.concat([rows_from_metrics({"sink_ratio": np.array([[r * f]])}, {**labels, "seed": s}, layers=[depth])
                      for s, f in ((0, 0.99), (1, 1.01))], ignore_index=True)


def _table(plain: dict[tuple[str, int], tuple[float, float]]) -> pd.DataFrame:
    """The plain residual's pairs ``{(shared, depth): (r_off, r_on)}``; every normalised cell at r = 1."""
    parts = []
    for (shared, depth), (off, on) in plain.items():
        parts += [_cell("none", shared, depth, "off", off), _cell("none", shared, depth, "on", on)]
        parts += [_cell(n, shared, depth, h, 1.0) for n in ("rmsnorm", "layernorm") for h in ("off", "on")]
    return pd.concat(parts, ignore_index=True)


PAIRS = [("off", 24), ("off", 48), ("on", 24), ("on", 48)]


@pytest.mark.parametrize("on, verdict", [((1.2, 1.1, 1.3, 1.2), "reproduced"),
                                         ((2.5, 3.5, 2.2, 5.0), "not reproduced"),
                                         ((1.2, 1.3, 2.5, 2.6), "mixed")])
def test_s1_reads_removes_does_not_remove_and_depends(on, verdict):
    claim = load_config("sinks")["claims"][0]
    table = _table({p: (6.0, r) for p, r in zip(PAIRS, on)})
    assert C.registered_verdict(C.evaluate_claim(table, claim, n_boot=200)) == verdict
    controls = evaluate_controls(table, claim, n_boot=200)
    assert controls["positive"]["verdict"] == "reproduced" and controls["negative"]["verdict"] == "not reproduced"


def test_s1_a_pair_without_a_sink_is_no_evidence():
    """r_off within the band too: the factor-off arm passes, so the pair carries no verdict."""
    claim = load_config("sinks")["claims"][0]
    table = _table({("off", 24): (1.2, 1.1), ("off", 48): (6.0, 1.1), ("on", 24): (6.0, 1.1), ("on", 48): (6.0, 1.1)})
    res = C.evaluate_claim(table, claim, n_boot=200)
    outcomes = {c["check"]: c["outcome"] for c in res["checks"] if not c["informational"]}
    check = "plain residual, head-wise RMSNorm: r <= b [v=pre_ln,shared=off,headwise_rmsnorm=on, D=24]"
    assert outcomes[check] == C.FACTOR_OFF_PASSES
    assert C.registered_verdict(res) == "mixed"


def test_phase_sink_unit_is_the_phase_cell(tmp_path):
    """One smoke unit's rows: r = sink_mass / sink_mass_uniform of phase's own run_group for
    the same cell and weight seed, the uniform causal row (H_N - 1) / (N - 1)."""
    run_experiment("sinks", "smoke", tmp_path / "o", 0)
    table = pd.read_parquet(tmp_path / "o" / "table.parquet")
    assert set(table["source"]) == {"phase_sink"} and set(table["dtype"]) == {"float64"}
    assert sorted(set(table["seed"])) == [1000, 1001]
    row = table[(table["norm"] == "none") & (table["variant"] == "pre_ln,shared=off,headwise_rmsnorm=on")
                & (table["depth"] == 24) & (table["seed"] == 1001)].set_index("metric")
    assert set(row["layer"]) == {24}
    N = 64
    assert row.loc["sink_mass_uniform", "mean"] == pytest.approx((sum(1 / k for k in range(1, N + 1)) - 1) / (N - 1),
                                                                rel=1e-12)
    (cell,) = expand_grid({"norm": ["none"], "placement": ["pre_ln"], "shared": [False], "depth": [24],
                           "headwise_rmsnorm": [True], "mask": ["causal"], "n_tokens": [64], "d_model": [32]})
    (ref,) = run_group([cell], n_samples=2, seeds=1, seed=1001)
    assert row.loc["sink_mass", "mean"] == pytest.approx(ref["sink_mass"], rel=1e-12)
    assert row.loc["sink_ratio", "mean"] == pytest.approx(ref["sink_mass"] / ref["sink_mass_uniform"], rel=1e-12)
    claims = json.loads((tmp_path / "o" / "claims.json").read_text())
    assert [c["id"] for c in claims] == ["S1"]
    assert claims[0]["verdict"] in C.VERDICTS and claims[0]["verdict"] != "not run"
    # 2 seeds x 2 inputs decide little: the controls run through the same rule and are read
    assert {claims[0]["controls"][k]["verdict"] for k in ("positive", "negative")} <= set(C.VERDICTS) - {"not run"}
    assert math.isfinite(claims[0]["measured"])
