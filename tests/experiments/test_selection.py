"""Row selection of the claim rules: the (setting, metric) parts read through a per-table
cache give exactly the rows of a plain filter of the whole table."""

import numpy as np
import pandas as pd
import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.experiments.selection import AmbiguousSelection, one_condition, select_rows


def _table(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "setting": rng.choice(["default", "norm=rmsnorm"], n),
        "metric": rng.choice(["mu", "mu_relative", "avg_cos"], n),
        "variant": rng.choice(["pure", "post_ln"], n),
        "layer": rng.integers(0, 4, n),
        "d_qk": rng.choice([1.0, 64.0], n),
        "mean": rng.standard_normal(n),
    })


def _plain(table, select, setting):
    keep = table["setting"] == setting
    for col, want in select.items():
        wants = want if isinstance(want, list) else [want]
        if table[col].dtype.kind == "f":
            keep &= np.logical_or.reduce([np.isclose(table[col], float(w)) for w in wants])
        else:
            keep &= table[col].astype(str).isin([str(w) for w in wants])
    return table[keep]


@pytest.mark.parametrize("select, setting", [
    ({"metric": "mu"}, "default"),
    ({"metric": "mu_relative", "variant": "post_ln"}, "norm=rmsnorm"),
    ({"metric": "avg_cos", "layer": 2, "d_qk": 64}, "default"),
    ({"metric": ["mu", "avg_cos"], "variant": "pure"}, "default"),  # a list: no part, the plain path
    ({"metric": "nosuch"}, "default"),
])
def test_selection_equals_a_plain_filter_of_the_whole_table(select, setting):
    table = _table()
    for _ in range(2):  # the second call reads the cached part
        pd.testing.assert_frame_equal(select_rows(table, select, setting), _plain(table, select, setting))


def test_a_changed_table_is_read_again():
    table = _table()
    select_rows(table, {"metric": "mu"}, "default")
    table.loc[len(table)] = ["default", "mu", "pure", 0, 1.0, 9.0]  # one more row: the parts are rebuilt
    assert 9.0 in set(select_rows(table, {"metric": "mu"}, "default")["mean"])
    table["extra"] = "x"  # a new column: rebuilt too
    assert "extra" in select_rows(table, {"metric": "mu"}, "default")


def test_a_non_string_metric_column_takes_the_plain_path():
    table = _table()
    table["metric"] = table["metric"].astype(object)
    table.loc[0, "metric"] = 7  # a number among the names: compared as its text
    pd.testing.assert_frame_equal(select_rows(table, {"metric": "7"}, table.loc[0, "setting"]),
                                  table.iloc[[0]])


def test_an_unknown_column_and_several_conditions_are_refused():
    table = _table()
    with pytest.raises(ConfigError, match="unknown column 'nosuch'"):
        select_rows(table, {"metric": "mu", "nosuch": 1})
    rows = select_rows(table.assign(source="simulate", model="m", mask_spec="causal", norm="", sphere_radius=np.nan,
                                    value="", init_scale=np.nan, depth=4), {"metric": "mu"})
    with pytest.raises(AmbiguousSelection, match="4 conditions"):  # variant x d_qk
        one_condition(rows, "mu")
    assert one_condition(rows[(rows.variant == "pure") & (rows.d_qk == 1)], "mu") is not None
