"""The theory's agreement counts a cell against a prediction only when the measurement
contradicts it: ``collapsing_slowly`` under Theorem 1's ``rank_collapse`` (μ still falling,
under the envelope) agrees, a point above the envelope or another end state disagrees,
and what the measurement cannot decide is ``undecided``, never agreement."""

import math

import pandas as pd
import pytest

from rankcollapse.phase.batched import run_group
from rankcollapse.phase.grid import DEFAULTS
from rankcollapse.phase.report import theory_agreement, theory_verdict

NAN = float("nan")

#: (theory_source, theory_regime, regime, envelope_violations, verdict)
CASES = [
    ("theorem1", "rank_collapse", "rank_collapse", 0.0, "agree"),
    ("theorem1", "rank_collapse", "collapsing_slowly", 0.0, "agree"),
    ("theorem1", "rank_collapse", "collapsing_slowly", 3.0, "disagree"),  # above the envelope
    ("theorem1", "rank_collapse", "rank_collapse", 1.0, "disagree"),
    ("theorem1", "rank_collapse", "undecided", 0.0, "undecided"),
    ("theorem1", "rank_collapse", "uniform_attention", 0.0, "undecided"),
    ("theorem1", "rank_collapse", "stable_rank_k", 0.0, "disagree"),
    ("theorem2", "rank_collapse", "collapsing_slowly", NAN, "agree"),
    ("theorem2", "rank_collapse", "aligned_without_consensus", NAN, "disagree"),
    ("theorem2", "rank_collapse", "one_hot_attention", NAN, "undecided"),
    ("equilibria", "stable_rank_k", "stable_rank_k", NAN, "agree"),
    ("equilibria", "stable_rank_k", "rank_collapse", NAN, "disagree"),
    ("equilibria", "stable_rank_k", "collapsing_slowly", NAN, "undecided"),
    ("pure_sa_outside_A2", "", "diverging", 40.0, ""),  # no prediction: not counted
]


def _table(cases):
    return pd.DataFrame([{"theory_source": s, "theory_regime": p, "regime": r, "envelope_violations": v}
                         for s, p, r, v, _ in cases])


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}:{c[2]}:{c[3]}" for c in CASES])
def test_verdict_of_each_hand_built_cell(case):
    assert theory_verdict(_table([case]).iloc[0]) == case[-1]


def test_agreement_counts_add_up_and_undecided_is_not_agreement():
    out = theory_agreement(_table(CASES))
    assert out["n"] == 13 and out["counts"] == {"agree": 4, "disagree": 5, "undecided": 4}
    assert out["agree"] == pytest.approx(4 / 13) and out["undecided"] == pytest.approx(4 / 13)
    assert out["agree"] + out["disagree"] + out["undecided"] == pytest.approx(1.0)
    assert out["theorem1"]["counts"] == {"agree": 2, "disagree": 3, "undecided": 2}
    assert out["equilibria"]["counts"] == {"agree": 1, "disagree": 1, "undecided": 1}
    assert "pure_sa_outside_A2" not in out
    empty = theory_agreement(_table(CASES[-1:]))
    assert empty["n"] == 0 and math.isnan(empty["agree"])


def _cell(**over):
    (row,) = run_group([{**DEFAULTS, "n_tokens": 32, "d_model": 16, "depth": 64, **over}], n_samples=8, seed=0)
    return row


def test_real_cells_positive_and_negative_controls():
    """Positive: Theorem 1 cells through the sweep's own path, a radius-16 window
    (μ still falling at layer 64: collapsing_slowly, 0 points above the envelope) and the
    complete mask (collapsed) both agree. Negative: the same window with ||W_V|| = 2 (A2
    fails, so the theory makes no claim) given Theorem 1's claim as if it had one: its
    points above the envelope make it disagree."""
    window = _cell(value="orthogonal", mask="sliding_window:w=3")
    complete = _cell(value="orthogonal")
    assert window["theory_source"] == complete["theory_source"] == "theorem1"
    assert window["regime"] == "collapsing_slowly" and window["envelope_violations"] == 0
    assert complete["regime"] == "rank_collapse"
    table = pd.DataFrame([window, complete])
    assert theory_agreement(table)["counts"] == {"agree": 2, "disagree": 0, "undecided": 0}
    wrong = _cell(value="orthogonal", value_scale=2.0, mask="sliding_window:w=3")
    assert wrong["theory_source"] == "pure_sa_outside_A2" and wrong["envelope_violations"] > 0
    claimed = pd.DataFrame([{**wrong, "theory_regime": "rank_collapse", "theory_source": "theorem1"}])
    assert theory_agreement(claimed)["counts"] == {"agree": 0, "disagree": 1, "undecided": 0}
