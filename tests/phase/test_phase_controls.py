"""Every regime rule on a positive control (the regime certainly present) and a negative
control (certainly absent), through the sweep's own path (:func:`run_group`: weights,
inputs, batched dynamics, measures, labels, fractions)."""

import pytest

from rankcollapse.phase.batched import run_group
from rankcollapse.phase.grid import DEFAULTS

SMALL = {"n_tokens": 8, "d_model": 4, "depth": 64}


def cell(**over):
    return {**DEFAULTS, **SMALL, **over}


def one(c, samples=8, seed=0):
    (row,) = run_group([c], n_samples=samples, seed=seed)
    return row


def test_diverging_controls():
    # pure SA with ||W_V||_2 = 2 per layer: ||X|| grows ~2^64 > 1e12
    assert one(cell(value="orthogonal", value_scale=2.0))["frac_diverging"] == 1.0
    # the same weights under LayerNorm: rows have norm sqrt(d) after every layer
    assert one(cell(value="orthogonal", value_scale=2.0, norm="layernorm"))["frac_diverging"] == 0.0


def test_rank_collapse_controls():
    # pure SA, complete mask, orthogonal W_V (Theorem 1 at radius 1)
    row = one(cell(value="orthogonal", n_tokens=32, d_model=16))
    assert row["frac_rank_collapse"] == 1.0 and row["regime"] == "rank_collapse"
    # uniform averaging over 3 neighbours for 16 layers cannot bring mu/||X|| below 1e-6 at N = 32
    row = one(cell(value="orthogonal", qk_scale=0.0, mask="sliding_window:w=3", n_tokens=32, d_model=16, depth=16))
    assert row["frac_rank_collapse"] == 0.0


def test_collapsing_slowly_controls():
    # pure SA, radius 16: mu falls at every layer but stays far above 1e-6 by layer 64
    row = one(cell(value="orthogonal", mask="sliding_window:w=3", n_tokens=32, d_model=16))
    assert row["regime"] == "collapsing_slowly" and row["frac_collapsing_slowly"] >= 0.5
    assert row["rate_last_hi"] < 0
    # the skip keeps mu/||X|| rising under uniform attention: not falling
    row = one(cell(value="orthogonal", qk_scale=0.0, mask="sliding_window:w=3", placement="post_ln", alpha=1.0))
    assert row["frac_collapsing_slowly"] == 0.0 and row["rate_last"] > 0


def test_uniform_attention_controls():
    # s = 0: every attention row is exactly uniform; mu/||X|| does not fall (skip, no norm)
    row = one(cell(value="orthogonal", qk_scale=0.0, mask="sliding_window:w=3", placement="post_ln", alpha=1.0))
    assert row["regime"] == "uniform_attention" and row["frac_uniform_attention"] == 1.0
    assert row["entropy_last"] == pytest.approx(1.0, abs=1e-12)
    # s = 8: sharp attention
    assert one(cell(value="orthogonal", qk_scale=8.0, mask="sliding_window:w=3", placement="post_ln", alpha=1.0))["frac_uniform_attention"] == 0.0


def test_one_hot_attention_controls():
    # skip without a norm: ||X|| grows, logits grow as ||X||^2, attention goes one-hot
    row = one(cell(value="gaussian", qk_scale=0.1, mask="sliding_window:w=3", placement="post_ln", alpha=1.0))
    assert row["regime"] == "one_hot_attention" and row["frac_one_hot_attention"] == 1.0
    assert row["entropy_last"] < 0.05
    # the same cell at s = 0: attention is uniform whatever the norm of X
    assert one(cell(value="gaussian", qk_scale=0.0, mask="sliding_window:w=3", placement="post_ln", alpha=1.0))["frac_one_hot_attention"] == 0.0


STABLE_2X2 = {"n_tokens": 2, "d_model": 2, "depth": 256, "norm": "sphere", "mask": "causal", "qk_scale": 0.0,
              "shared": True, "input": "sphere", "value": "gaussian"}


def test_stable_rank_2_basins_of_four_value_matrices():
    """The control below on four of its draws (two with a basin, two without), fast: the
    fraction sees 2 and 1 of 16 starts in a stable rank-2 state while the label stays
    rank_collapse, and fresh weights per layer leave none."""
    rows = {s: one({**DEFAULTS, **STABLE_2X2}, samples=16, seed=s) for s in (0, 1, 5, 14)}
    assert {s: r["frac_stable_rank_k"] for s, r in rows.items()} == {0: 0.0, 1: 0.0, 5: 2 / 16, 14: 1 / 16}
    assert rows[5]["regime"] == rows[14]["regime"] == "rank_collapse"
    for s in (5, 14):
        assert one({**DEFAULTS, **STABLE_2X2, "shared": False}, samples=16, seed=s)["frac_stable_rank_k"] == 0.0


@pytest.mark.slow  # 44 runs of 256 layers (~18 CPU-s); the test above checks four of the draws
def test_stable_rank_2_basins_of_random_time_invariant_value_matrices():
    """Positive control: 40 random 2x2 W_V (time-invariant, unit-sphere SA-LN, causal,
    s = 0, 256 layers, 16 uniform starts each): 4 of them send 1 or 2 of 16 starts to a
    stable rank-2 state. The majority label of each is rank_collapse, so only the
    fraction sees the basin."""
    rows = [one({**DEFAULTS, **STABLE_2X2}, samples=16, seed=s) for s in range(40)]
    hits = [r for r in rows if r["frac_stable_rank_k"] > 0]
    assert len(hits) == 4
    assert all(r["frac_stable_rank_k"] in (1 / 16, 2 / 16) for r in hits)
    assert all(r["regime"] == "rank_collapse" for r in hits)
    # negative control: the same draws with fresh weights per layer have no fixed state to settle on
    seeds = [s for s, r in enumerate(rows) if r["frac_stable_rank_k"] > 0]
    for s in seeds:
        assert one({**DEFAULTS, **STABLE_2X2, "shared": False}, samples=16, seed=s)["frac_stable_rank_k"] == 0.0


def test_fractions_sum_to_one_and_match_the_label():
    row = one(cell(value="orthogonal", mask="causal"))
    from rankcollapse.phase.regime import REGIMES

    assert sum(row[f"frac_{r}"] for r in REGIMES) == pytest.approx(1.0)
    assert row[f"frac_{row['regime']}"] > 0.5


def test_theorem1_envelope_controls():
    """Every (layer, trajectory) point under Theorem 1's envelope where its assumptions hold;
    with ||W_V|| = 2 (A2 fails) the same check finds points above it: it can fail."""
    row = one(cell(value="orthogonal", mask="causal", qk_scale=2.0))
    assert row["theory_source"] == "theorem1"
    assert row["envelope_points"] == 8 * 65 and row["envelope_violations"] == 0
    assert row["envelope_log10_margin"] < 0
    bad = one(cell(value="orthogonal", value_scale=2.0, mask="causal", qk_scale=2.0))
    assert bad["theory_source"] == "pure_sa_outside_A2"
    assert bad["envelope_violations"] > 0 and bad["envelope_log10_margin"] > 0
    # no envelope outside pure SA
    assert one(cell(value="orthogonal", norm="sphere"))["envelope_points"] == 0
