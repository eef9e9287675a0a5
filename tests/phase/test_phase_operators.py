"""Attention operators as a phase axis: the sweep's fast path against simulate, and the
``aligned_without_consensus`` rule's positive and negative controls through the sweep's
own path (``run_group``)."""

from __future__ import annotations

import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.phase.batched import run_group
from rankcollapse.phase.cell import run_cell
from rankcollapse.phase.grid import expand_grid, parse_axis

FIXED = {"n_tokens": 32, "d_model": 16, "depth": 64, "value": "orthogonal", "input": "gaussian"}


def _cells(*axes):
    return expand_grid(dict(parse_axis(a) for a in axes), FIXED)


def test_axis_takes_operator_specs_and_refuses_bad_ones():
    assert [c["attention"] for c in _cells("attention=softmax,offbyone,sink:b=2,sigmoid,diff:lambda=0.5")] == [
        "softmax", "sink:b=0", "sink:b=2", "sigmoid", "diff:lambda=0.5"]
    with pytest.raises(ConfigError, match="--axis attention"):
        parse_axis("attention=sink")


@pytest.mark.parametrize("spec", ["sink:b=2", "sigmoid", "diff:lambda=0.5"])
def test_batched_operator_cells_match_simulate(spec):
    (cell,) = _cells(f"attention={spec}", "mask=causal")
    cell["depth"] = 12
    a, b = run_group([cell], samples=2)[0], run_cell(cell, samples=2)
    assert a["regime"] == b["regime"]
    for key in ("mu_relative", "row_mass_deficit", "norm_spread"):
        assert a[key] == pytest.approx(b[key], rel=1e-8, abs=1e-13), key
    assert a["theory_source"] == "not_row_stochastic" and a["theory_regime"] == ""


def test_aligned_without_consensus_controls():
    """Positive: pure SA, causal mask, off-by-one softmax: every trajectory aligns while
    mu/||X||_F stays at the Perron profile's 0.488 (docs/theory.md §8). Negative: the same
    under the complete mask (equal row masses at consensus): none; softmax causal: none."""
    pos, neg, soft = (run_group([c], samples=8)[0] for c in (
        _cells("attention=offbyone", "mask=causal")[0], _cells("attention=offbyone", "mask=complete")[0],
        _cells("attention=softmax", "mask=causal")[0]))
    assert pos["regime"] == "aligned_without_consensus" and pos["frac_aligned_without_consensus"] == 1.0
    assert pos["mu_relative"] == pytest.approx(0.4883, abs=1e-3) and pos["norm_spread"] == pytest.approx(32, rel=1e-3)
    assert 0 < pos["row_mass_deficit"] < 1
    for row in (neg, soft):
        assert row["frac_aligned_without_consensus"] == 0.0 and row["regime"] == "rank_collapse"
    assert soft["row_mass_deficit"] == pytest.approx(0.0, abs=1e-12)
