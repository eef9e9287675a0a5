"""The C10 equilibria search (`experiments.theory_units.rows_equilibria_search`): what
each kind of start finds, on a system small enough for a test (N = d = 3)."""

import pandas as pd
import pytest

from rankcollapse.experiments.theory_units import rows_equilibria_search


@pytest.fixture(scope="module")
def counts() -> pd.DataFrame:
    df = rows_equilibria_search({"eq_n_tokens": 3, "eq_d_model": 3, "search_starts": 32}, None)
    return df.pivot(index="layer", columns="metric", values="mean")


def test_rows_keep_the_claim_columns(counts):
    assert {"n_found", "n_found_random", "expected_min"} <= set(counts.columns)
    assert list(counts.index) == [1, 2, 3]
    assert list(counts["expected_min"]) == [2.0, 4.0, 8.0]


def test_constructed_starts_return_the_construction(counts):
    # seeded with the construction: every one of the 2^k states comes back (a verification, no discovery)
    assert (counts["n_constructed_found"] == counts["expected_min"]).all()
    assert (counts["n_found"] >= counts["expected_min"]).all()


def test_perturbed_starts_recover_the_constructed_states_of_rank_2_and_up(counts):
    # noise 0.01 per entry: Newton returns to each isolated constructed state of rank >= 2
    assert counts.loc[2, "n_constructed_perturbed"] == 4 and counts.loc[3, "n_constructed_perturbed"] == 8


def test_random_starts_do_not_find_the_constructed_full_rank_states(counts):
    # every constructed equilibrium of rank >= 2 has unstable directions (docs/theory.md §3b)
    assert counts.loc[3, "n_constructed_random"] < counts.loc[3, "expected_min"]
    assert counts.loc[3, "n_stable"] == 0 and counts.loc[2, "n_stable"] == 0
