"""The one summariser (rankcollapse.summary) against numpy float64 on hand-built data, and
the tables that use it (reproduce rows, probe, SimResult, BoundResult) agreeing."""

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from rankcollapse.experiments.table import rows_from_metrics
from rankcollapse.summary import STAT_COLUMNS, SUMMARY_COLUMNS, by_layer, summarise, summary_table


def test_summarise_equals_numpy_on_hand_built_rows():
    v = np.array([[1.0, 2.0, 4.0, 8.0, 16.0], [3.0, 3.0, 3.0, 3.0, 3.0]])
    s = summarise(v)
    assert s["mean"].tolist() == [6.2, 3.0]
    assert s["std"][0] == np.sqrt(np.mean((v[0] - 6.2) ** 2)) and s["std"][1] == 0.0
    # linear quantiles of 1, 2, 4, 8, 16: position q * 4 between sorted values
    assert s["q05"][0] == pytest.approx(1.2, abs=1e-15) and s["q25"][0] == 2.0 and s["q50"][0] == 4.0
    assert s["q75"][0] == 8.0 and s["q95"][0] == pytest.approx(16 - 0.2 * 8, abs=1e-14)
    for name, q in zip(("q05", "q25", "q50", "q75", "q95"), (0.05, 0.25, 0.5, 0.75, 0.95)):
        assert (s[name] == np.quantile(v, q, axis=1)).all()
    assert s["n_samples"].tolist() == [5, 5] and s["n_samples"].dtype == np.int64


def test_summarise_leaves_out_every_non_finite_value():
    v = np.array([[1.0, np.nan, 3.0, np.inf, -np.inf, 5.0]])
    s = summarise(v)
    ref = np.array([1.0, 3.0, 5.0])
    assert s["mean"][0] == ref.mean() and s["std"][0] == ref.std() and s["n_samples"][0] == 3
    assert s["q25"][0] == np.quantile(ref, 0.25) and s["q95"][0] == np.quantile(ref, 0.95)


def test_summarise_row_without_finite_value_leaves_other_rows_intact():
    s = summarise(np.array([[np.nan, np.inf], [1.0, 3.0]]))
    assert np.isnan(s["mean"][0]) and np.isnan(s["q50"][0]) and s["n_samples"][0] == 0
    assert s["q50"][1] == 2.0 and s["mean"][1] == 2.0


def _numpy_row(row: np.ndarray) -> dict:
    """numpy's own statistics of one row alone, non-finite values left out (the reference)."""
    f = np.where(np.isfinite(row), row, np.nan)
    if np.isnan(f).all():
        return dict.fromkeys(("mean", "std", "q05", "q25", "q50", "q75", "q95"), np.nan) | {"n_samples": 0}
    with np.errstate(all="ignore"):
        qs = np.nanquantile(f, [0.05, 0.25, 0.5, 0.75, 0.95])
        return {"mean": np.nanmean(f), "std": np.nanstd(f), **dict(zip(("q05", "q25", "q50", "q75", "q95"), qs)),
                "n_samples": int(np.isfinite(row).sum())}


_ROW_VALUES = st.one_of(st.floats(allow_subnormal=True), st.sampled_from([0.0, -0.0, 1.0, np.nan, np.inf, -np.inf]))


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.integers(0, 3).flatmap(lambda b: st.lists(
    arrays(np.float64, b, elements=_ROW_VALUES), min_size=1, max_size=3)), min_size=1, max_size=4))
def test_summary_table_equals_numpy_row_by_row_bit_for_bit(rows):
    """Rows of 0 to 3 samples (several rows per length, summarised together), NaN, ±inf,
    all-NaN rows, ties of 0.0 and -0.0: each statistic is numpy's of that row alone, sign
    of zero included."""
    every = [r for group in rows for r in group]
    df = summary_table({(i, "p", "m"): r for i, r in enumerate(every)})
    for i, r in enumerate(every):
        for k, want in _numpy_row(r).items():
            got = df[k].iloc[i]
            assert (np.isnan(got) and np.isnan(want)) or (got == want and np.signbit(got) == np.signbit(want)), k


def test_summary_table_layout_and_values_column():
    df = summary_table({(0, "embeddings", "mu"): [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]}, per_window=True)
    assert list(df.columns) == list(SUMMARY_COLUMNS) + ["values"]
    assert df["mean"].iloc[0] == 2.0 and df["n_samples"].iloc[0] == 3 and df["values"].iloc[0].tolist() == [1, 2, 3]


def test_probe_rows_and_reproduce_rows_agree_on_the_same_values():
    """A probe keys its per-window values by (layer, point, metric); reproduce's simulated
    rows come from (L, B) arrays: the same values give the same statistics, bit for bit."""
    rng = np.random.default_rng(3)
    vals = np.exp(rng.normal(size=(4, 37)) * 3)
    vals[2, 5] = np.nan
    keyed = {(t, f"layer.{t - 1}.output" if t else "embeddings", "mu"): [torch.from_numpy(vals[t, :20]),
                                                                        torch.from_numpy(vals[t, 20:])]
             for t in range(4)}
    probe_like = summary_table(keyed, per_window=True)
    rows = rows_from_metrics({"mu": torch.from_numpy(vals)}, {"mask": "causal"})
    pd.testing.assert_frame_equal(rows[list(SUMMARY_COLUMNS)], probe_like[list(SUMMARY_COLUMNS)])
    assert all((a == b)[~np.isnan(a)].all() for a, b in zip(rows["values"], probe_like["values"]))


def test_simresult_and_boundresult_summaries_use_the_layout():
    from rankcollapse.dynamics import RunConfig, gaussian_tokens, simulate
    from rankcollapse.theory import check_collapse_bound

    res = simulate(gaussian_tokens(4, 6, 3, seed=0), mask="causal", run=RunConfig(depth=3, seed=0))
    df = res.to_pandas(summary=True)
    assert list(df.columns) == list(SUMMARY_COLUMNS) and len(df) == 2 * 4
    mu = res.metrics["mu"].double().numpy()
    row = df[(df.metric == "mu") & (df.layer == 2)].iloc[0]
    assert row.point == "layer.1.output" and row["mean"] == mu[2].mean() and row.q75 == np.quantile(mu[2], 0.75)
    assert set(res.to_pandas().columns) == {"layer", "sample", "metric", "value"}  # per-sample default unchanged
    bound = check_collapse_bound("causal", n_tokens=6, d_model=3, depth=4, n_samples=3, seed=0)
    b = bound.to_pandas(summary=True)
    assert set(b.metric) == {"mu", "envelope"} and list(b.columns) == list(SUMMARY_COLUMNS)
    assert (b[b.metric == "envelope"]["q50"].to_numpy() == np.median(bound.envelope.numpy(), axis=1)).all()
    assert set(STAT_COLUMNS) <= set(b.columns)
