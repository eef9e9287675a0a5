"""The decay law of phase cells on closed forms, and the speed-law and ordering rules of
rankcollapse.phase.normalisation on hand-built tables and through the sweep."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rankcollapse.phase import normalisation as nz
from rankcollapse.phase.batched import run_group
from rankcollapse.phase.cell import block_config
from rankcollapse.phase.grid import DEFAULTS, expand_grid
from rankcollapse.phase.regime import gap_floor, law_cell
from rankcollapse.phase.sweep import BATCH_CELLS, batches

UNIFORM = {"n_tokens": 16, "d_model": 8, "depth": 128, "qk_scale": 0.0, "value": "orthogonal"}


def test_uniform_attention_pre_ln_decays_as_t_to_the_minus_two():
    """qk_scale = 0: every update is common to all tokens, x_i - x_j never changes, and with
    one orthogonal W_V for every layer the norm grows linearly: g(t) ~ |dx|^2 / (2 t^2)."""
    (row,) = run_group(expand_grid({}, {**UNIFORM, "placement": "pre_ln", "norm": "sphere", "shared": True}), n_samples=8)
    assert row["law"] == "power" and row["frac_law_power"] == 1.0
    assert row["law_exponent"] == pytest.approx(-2.0, abs=0.25)
    assert row["law_r2_power"] > row["law_r2_exp"]


def test_uniform_attention_post_ln_decays_exponentially():
    (row,) = run_group(expand_grid({}, {**UNIFORM, "placement": "post_ln", "norm": "sphere"}), n_samples=8)
    assert row["law"] == "exponential" and row["frac_law_exponential"] == 1.0
    assert row["law_rate"] < -0.5 and row["law_r2_exp"] > 0.99


@pytest.mark.parametrize("placement", ["post_ln", "pre_ln"])
def test_zero_values_leave_the_gap_constant_and_no_law_is_called(placement):
    (row,) = run_group(expand_grid({}, {**UNIFORM, "placement": placement, "norm": "sphere", "value_scale": 0.0,
                                        "depth": 32}), n_samples=4)
    assert row["law"] == "undecided" and row["frac_law_undecided"] == 1.0


def test_a_gap_at_the_float64_floor_is_undecided_not_a_law():
    """Pure SA under uniform attention makes every token the mean in one layer: the gap is
    at round-off from layer 1 on, so no law can be read from it."""
    (row,) = run_group(expand_grid({}, {**UNIFORM, "depth": 16}), n_samples=4)
    assert row["regime"] == "rank_collapse"
    assert row["law"] == "undecided" and np.isnan(row["law_r2_exp"])
    assert gap_floor(16, 8) == pytest.approx((8 + 256) * np.finfo(np.float64).eps / 2)


def test_law_cell_takes_a_strict_majority_and_counts_diverged_as_undecided():
    tr = lambda law, p: {"diverged": False, "law": law, "law_exponent": p, "law_rate": -0.1,  # noqa: E731
                         "law_r2_exp": 0.9, "law_r2_power": 0.8}
    row = law_cell([tr("power", -2.0), tr("power", -1.0), tr("exponential", -5.0), {"diverged": True}])
    assert row["law"] == "undecided" and row["frac_law_power"] == 0.5  # 2 of 4 is no majority
    assert row["law_exponent"] == -2.0  # median of the three finite values
    assert law_cell([tr("power", -2.0)] * 3 + [tr("exponential", 0.0)])["law"] == "power"
    assert law_cell([{"diverged": False, "mu_relative": 0.5}]) == {}  # no avg_cos recorded: no columns


def test_a_cell_made_before_the_qk_norm_axis_runs_without_it():
    old = {k: v for k, v in DEFAULTS.items() if k != "qk_norm"}
    assert block_config(old).qk_norm is False
    assert block_config({**DEFAULTS, "placement": "mix", "norm": "layernorm", "alpha": 1.0, "depth": 10}).mix_layers == 2


def _cells(placement, laws, **over):
    base = {**DEFAULTS, "norm": "sphere", "qk_scale": 1.0, "placement": placement, **over}
    return [{**base, "law": law, "law_exponent": -2.0 if law == "power" else -8.0, "value_scale": 1.0 + i}
            for i, law in enumerate(laws)]


def test_speed_law_rule_on_hand_built_tables():
    table = pd.DataFrame(_cells("post_ln", ["exponential"] * 12 + ["undecided"] * 5)
                         + _cells("pre_ln", ["power"] * 11 + ["exponential"], shared=True))
    out = nz.speed_law(table)
    assert out["post_ln"]["decided"] == 12 and out["post_ln"]["verdict"] == "exponential"
    assert out["pre_ln"]["verdict"] == "power" and out["verdict"] == "holds"
    assert out["pre_ln_exponent"]["verdict"] == "consistent"
    flipped = pd.DataFrame(_cells("post_ln", ["power"] * 12) + _cells("pre_ln", ["power"] * 12))
    assert nz.speed_law(flipped)["verdict"] == "fails"
    even = pd.DataFrame(_cells("post_ln", ["power", "exponential"] * 3) + _cells("pre_ln", ["power"] * 12))
    assert nz.speed_law(even)["verdict"] == "undecided"
    out_of_scope = pd.DataFrame(_cells("post_ln", ["power"] * 12, qk_scale=0.0) + _cells("pre_ln", ["power"] * 12,
                                                                                          norm="dyt"))
    assert nz.speed_law(out_of_scope)["post_ln"]["cells"] == 0 and nz.speed_law(out_of_scope)["pre_ln"]["cells"] == 0


def test_the_papers_exponent_is_decided_on_its_setting_and_the_pooled_median_apart():
    """Full attention with one set of weights reads -2.1; causal masks and fresh weights
    read -1.3: the paper's t^-2 is decided on the first only, the pooled median is no verdict."""
    paper = _cells("pre_ln", ["power"] * 6, shared=True)
    outside = (_cells("pre_ln", ["power"] * 10, mask="causal", shared=True)
               + _cells("pre_ln", ["power"] * 10, shared=False))
    rows = [{**c, "law_exponent": -2.1 + 0.01 * i} for i, c in enumerate(paper)]
    rows += [{**c, "law_exponent": -1.3 - 0.01 * i, "value_scale": 10.0 + i} for i, c in enumerate(outside)]
    out = nz.speed_law(pd.DataFrame(rows))
    assert out["pre_ln_exponent"]["cells"] == 6 and out["pre_ln_exponent"]["verdict"] == "consistent"
    assert out["pre_ln_exponent"]["median"] == pytest.approx(-2.075)
    assert out["pre_ln_exponent"]["setting"] == nz.PAPER_SETTING
    assert out["pre_ln_exponent_pooled"]["cells"] == 26 and "verdict" not in out["pre_ln_exponent_pooled"]
    assert out["pre_ln_exponent_pooled"]["median"] < -1.25 and out["pre_ln_exponent_pooled"]["median"] > -1.5
    assert out["paper_setting"]["pre_ln"]["cells"] == 6 and out["paper_setting"]["post_ln"]["cells"] == 0
    assert nz.speed_law(pd.DataFrame(rows[6:]))["pre_ln_exponent"]["verdict"] == "undecided"  # no cell of the setting


def test_identity_weights_control_reads_exponential_and_t_to_the_minus_two():
    """Equiangular tokens, W_Q = W_K = W_V = I, full attention: post-LN exponential, pre-LN
    a power law in the band around -2 (the control of the law fit in the paper's setting)."""
    out = nz.identity_control()
    assert out["passes"]
    pre = [r for r in out["runs"] if r["placement"] == "pre_ln"]
    assert all(r["law"] == "power" and -2.2 < r["law_exponent"] < -1.7 for r in pre)
    assert all(r["law"] == "exponential" for r in out["runs"] if r["placement"] == "post_ln")


def test_a_median_over_a_cell_at_round_off_is_a_bound():
    """post-LN at round-off (3e-16 < 2 (N + d) eps) makes pre-LN's lead at least what it
    reads: a bound, printed with ≥, never a magnitude; measured on both sides it is a number."""
    eps = np.finfo(np.float64).eps
    pairs = pd.DataFrame({"mu": [0.1, 0.2, 0.3], "mu_base": [3e-16, 1e-15, 1e-3], "n_tokens": 32, "d_model": 16})
    pairs["dlog10_mu"] = np.log10(pairs["mu"]) - np.log10(pairs["mu_base"])
    v = nz.above_verdict(pairs)
    assert 3e-16 < 2 * 48 * eps and v["median_bound"] == "lower" and v["pairs_base_at_floor"] == 2
    # read at the floor 96 eps, not at 3e-16: the median pair leads by at least log10(0.1 / (96 eps)), not 14.5
    assert v["median_dlog10_mu"] == pytest.approx(np.log10(0.1 / (96 * eps)))
    assert v["median_text"] == f"≥ {np.log10(0.1 / (96 * eps)):.3g}"
    pairs["mu_base"] = [1e-5, 1e-4, 1e-3]
    pairs["dlog10_mu"] = np.log10(pairs["mu"]) - np.log10(pairs["mu_base"])
    v = nz.above_verdict(pairs)
    assert v["median_bound"] is None and float(v["median_text"]) == pytest.approx(np.log10(0.2 / 1e-4), rel=1e-3)


def test_exponent_rule_reads_the_band():
    cells = pd.DataFrame({"law": ["power"] * 20, "law_exponent": np.linspace(-1.2, -0.8, 20)})
    assert nz.exponent_verdict(cells)["verdict"] == "inconsistent"
    cells["law_exponent"] = np.linspace(-2.2, -1.8, 20)
    assert nz.exponent_verdict(cells)["verdict"] == "consistent"


def test_ordering_rule_pairs_cells_equal_in_every_other_axis():
    rows = []
    for i in range(12):
        for p, m in (("post_ln", 1e-9), ("pre_ln", 1e-2), ("peri", 1e-12 if i < 10 else 1e-2)):
            rows.append({**DEFAULTS, "norm": "sphere", "placement": p, "qk_scale": 1.0, "value_scale": 1.0 + i,
                         "mu_relative": m})
    out = nz.ordering(pd.DataFrame(rows))
    assert out["vs_post_ln"]["pre_ln"]["verdict"] == "above" and out["vs_post_ln"]["pre_ln"]["pairs"] == 12
    assert out["vs_post_ln"]["peri"]["verdict"] == "below" and out["verdict"] == "fails"
    assert list(out["measured_order_sphere"]) == ["pre_ln", "post_ln", "peri"]  # medians -2, -9, -12
    floored = pd.DataFrame({"mu": [1e-16, 2e-16, 0.5], "mu_base": [3e-16, 1e-17, 1e-16]})
    floored["dlog10_mu"] = np.log10(floored["mu"]) - np.log10(floored["mu_base"])
    v = nz.above_verdict(floored)  # round-off against round-off is no evidence either way
    assert v["both_at_floor"] == 2 and v["untied"] == 1 and v["above"] == 1


def test_rules_and_controls_through_the_sweep():
    """A small sweep through run_group: the controls give their known answers."""
    fixed = {"n_tokens": 16, "d_model": 8, "depth": 128, "value": "orthogonal", "mask": "complete"}
    cells = expand_grid({"placement": ["post_ln", "pre_ln"], "norm": ["sphere", "layernorm"], "qk_norm": [False, True],
                         "qk_scale": [0.0, 1.0], "shared": [False, True]}, fixed)
    cells += expand_grid({"placement": ["post_ln", "pre_ln"], "value_scale": [0.0]}, {**fixed, "norm": "sphere",
                                                                                    "depth": 16})
    rows = [None] * len(cells)
    for part in batches(cells, BATCH_CELLS):  # the sweep's own batches: one batched run per group
        for i, row in zip(part, run_group([cells[i] for i in part], n_samples=4)):
            rows[i] = {**cells[i], **row}
    ctl = nz.controls(pd.DataFrame(rows))
    assert ctl["all_pass"], json.dumps(ctl, default=str)


def test_committed_phase_summaries_still_load():
    """docs/results/phase/summary.json was written before the law columns and the qk_norm
    axis: it still parses, and findings.summarize still reads a table without them."""
    from rankcollapse.phase.findings import summarize

    doc = json.loads((Path(__file__).parents[2] / "docs/results/phase/summary.json").read_text())
    assert doc["theorem1"]["cells"] == 288
    old = pd.DataFrame(run_group(expand_grid({}, {"n_tokens": 8, "d_model": 4, "depth": 8}), n_samples=2))
    old = pd.concat([pd.DataFrame([{k: v for k, v in DEFAULTS.items() if k != "qk_norm"}]), old], axis=1)
    old = old.drop(columns=[c for c in old if c.startswith(("law", "frac_law"))])
    out = summarize(old)
    assert out["cells"] == 1 and "decay_law" not in out
    new = pd.DataFrame([{**DEFAULTS, **r} for r in run_group(expand_grid({}, {"n_tokens": 8, "d_model": 4,
                                                                              "depth": 8}), n_samples=2)])
    assert summarize(new)["decay_law"] == {"none": {new["law"].iloc[0]: 1}}


def test_cli_sweeps_the_new_axes_and_prints_the_law(tmp_path):
    from tests.cli._harness import run_cli

    p = run_cli("phase", "--axis", "placement=peri,lns", "--axis", "norm=dyt,layernorm", "--axis", "qk_norm=off,on",
                "--depth", "8", "--n-tokens", "6", "--d-model", "4", "--n-samples", "2", "--out", str(tmp_path / "out"),
                "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert len(doc["cells"]) == 8
    assert {(c["placement"], c["norm"], c["qk_norm"]) for c in doc["cells"]} == {
        (p, n, q) for p in ("peri", "lns") for n in ("dyt", "layernorm") for q in (False, True)}
    assert all(c["law"] in ("exponential", "power", "undecided") for c in doc["cells"])
    bad = run_cli("phase", "--axis", "placement=ngpt", "--axis", "norm=layernorm", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "sphere" in bad.stderr
