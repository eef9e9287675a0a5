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
    a, b = run_group([cell], n_samples=2)[0], run_cell(cell, n_samples=2)
    assert a["regime"] == b["regime"]
    for key in ("mu_relative", "row_mass_deficit", "norm_spread", "max_token_share"):
        assert a[key] == pytest.approx(b[key], rel=1e-8, abs=1e-13), key
    assert a["theory_source"] == "not_row_stochastic" and a["theory_regime"] == ""


def test_aligned_without_consensus_controls():
    """Positive: pure SA, causal mask, off-by-one softmax: every trajectory aligns while
    mu/||X||_F stays at the Perron profile's 0.488 (docs/theory.md §8). Negative: the same
    under the complete mask (equal row masses at consensus): none; softmax causal: none."""
    pos, neg, soft = (run_group([c], n_samples=8)[0] for c in (
        _cells("attention=offbyone", "mask=causal")[0], _cells("attention=offbyone", "mask=complete")[0],
        _cells("attention=softmax", "mask=causal")[0]))
    assert pos["regime"] == "aligned_without_consensus" and pos["frac_aligned_without_consensus"] == 1.0
    assert pos["mu_relative"] == pytest.approx(0.4883, abs=1e-3) and pos["norm_spread"] == pytest.approx(32, rel=1e-3)
    assert 0 < pos["row_mass_deficit"] < 1
    for row in (neg, soft):
        assert row["frac_aligned_without_consensus"] == 0.0 and row["regime"] == "rank_collapse"
    assert soft["row_mass_deficit"] == pytest.approx(0.0, abs=1e-12)


def test_operator_cells_get_notes_on_what_mu_relative_does_not_show():
    import pandas as pd

    from rankcollapse.phase.report import operator_notes

    table = pd.DataFrame({"attention": ["softmax", "sigmoid", "sink:b=2"], "max_token_share": [0.1, 0.97, float("nan")]})
    notes = operator_notes(table)
    assert len(notes) == 2 and "2 of 3 cells run attention that is not row-stochastic (sigmoid, sink:b=2)" in notes[0]
    assert "in 1 of 3 cells one token holds more than half of ‖X‖_F²" in notes[1] and "0.97" in notes[1]
    assert operator_notes(table.iloc[:1]) == []


def test_cell_max_token_share_is_the_last_layer_share():
    """One token left, the others at zero norm: share 1; equal norms: share 1/N."""
    import torch

    from rankcollapse.phase.cell import operator_columns

    X = torch.zeros(2, 4, 3, dtype=torch.float64)
    X[0, 1, 0] = 5.0
    X[0, 2, 1] = 1e-3
    X[1] = torch.eye(4, 3, dtype=torch.float64) + torch.tensor([0, 0, 0, 1.0])[:, None] * torch.tensor([0, 0, 1.0])
    cols = operator_columns(X, torch.zeros(2), torch.zeros(2, dtype=torch.bool), slice(0, 1))
    assert cols["max_token_share"] == pytest.approx(25 / (25 + 1e-6), rel=1e-12)
    cols = operator_columns(X, torch.zeros(2), torch.zeros(2, dtype=torch.bool), slice(1, 2))
    assert cols["max_token_share"] == pytest.approx(1 / 4, rel=1e-12)
