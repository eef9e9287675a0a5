"""report_metrics: an undefined metric is None with a reason, the others still computed;
argument errors are typed; pairwise metrics are sized before allocation."""

import json
import math

import numpy as np
import pytest
import torch

from rankcollapse.errors import MemoryLimitError, MetricError
from rankcollapse.metrics import compute_metrics, report_metrics


def test_antipodal_tokens_leave_cos_to_mean_undefined_only():
    v = np.arange(1.0, 9.0)
    X = np.stack([v, -v, 2 * v, -2 * v])
    rep = report_metrics(X, "all")
    assert set(rep.undefined) == {"cos_to_mean"}
    assert "mean token is zero" in rep.undefined["cos_to_mean"]
    row = rep.rows()
    assert row["cos_to_mean"] is None and row["undefined"] == {"cos_to_mean": rep.undefined["cos_to_mean"]}
    # hand values: all tokens on one line -> |cos| = 1; cos = +1 for 4 ordered pairs, -1 for 8
    assert row["avg_abs_cos"] == pytest.approx(1.0)
    assert row["avg_cos"] == pytest.approx((4 - 8) / 12)
    assert row["numerical_rank"] == 1.0
    json.dumps(row, allow_nan=False)


def test_overflowing_scale_is_null_with_reason_and_strict_json():
    X = np.random.default_rng(0).random((16, 8)) * 1e300
    rep = report_metrics(X, "all")
    row = rep.rows()
    text = json.dumps(row, allow_nan=False)  # raises on NaN/Infinity
    assert "NaN" not in text and "Infinity" not in text
    for name, value in row.items():
        if name != "undefined":
            assert value is None or math.isfinite(value)
            assert (value is None) == (name in rep.undefined)
    # scale-free metrics that survive keep their value at scale 1
    ref = compute_metrics(X / 1e300, ["mu_relative", "stable_rank"])
    assert row["mu_relative"] == pytest.approx(float(ref["mu_relative"]), rel=1e-12)
    assert row["stable_rank"] == pytest.approx(float(ref["stable_rank"]), rel=1e-12)


def test_batch_metric_undefined_on_one_sample_names_it():
    # a metric undefined on some sample is undefined for the batch (the reason names
    # the samples); the other metrics keep every sample's value
    X = np.ones((2, 3, 2))
    X[1] = 0.0
    rep = report_metrics(X, ["mu", "mu_relative"])
    rows = rep.rows()
    assert "batch samples [1]" in rep.undefined["mu_relative"]
    assert [r["mu_relative"] for r in rows] == [None, None]
    assert [r["mu"] for r in rows] == [0.0, 0.0]


def test_input_no_metric_can_take_still_raises():
    X = np.ones((4, 3))
    X[0, 0] = np.nan
    with pytest.raises(MetricError, match="NaN"):
        report_metrics(X, "all")


def test_pairwise_metrics_sized_before_allocation():
    X = np.zeros((100_000, 8))
    X[:, 0] = 1.0
    with pytest.raises(MemoryLimitError, match=r"GiB.*--max-memory"):
        compute_metrics(X, ["avg_cos"], max_memory="1GiB")
    rep = report_metrics(X, ["mu", "avg_cos"], max_memory="1GiB")
    assert rep.rows()["mu"] == 0.0 and "max-memory" in rep.undefined["avg_cos"]


def test_argument_errors_are_typed():
    X = torch.eye(4, dtype=torch.float64)
    assert float(compute_metrics(X, ["mu"], dtype="float64")["mu"]) == pytest.approx(math.sqrt(3.0))
    with pytest.raises(MetricError, match="dtype"):
        compute_metrics(X, ["mu"], dtype="float65")
    with pytest.raises(MetricError, match="rank_rtol"):
        compute_metrics(X, ["numerical_rank"], rank_rtol=float("nan"))
    with pytest.raises(MetricError, match="rank_atol"):
        compute_metrics(X, ["numerical_rank"], rank_atol=-1.0)
    assert float(compute_metrics(X, ["numerical_rank"], rank_rtol=0.5)["numerical_rank"]) == 4.0
