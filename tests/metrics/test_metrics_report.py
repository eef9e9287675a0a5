"""report_metrics: an undefined metric is None with a reason, the others still computed;
argument errors are typed; pairwise metrics are sized before allocation."""

import json
import math

import numpy as np
import pytest
import torch

import metrics_numpy_reference as ref

from rankcollapse.errors import MemoryLimitError, MetricError
from rankcollapse.metrics import compute_metrics, report_metrics


def test_antipodal_tokens_leave_cos_to_mean_undefined_only():
    v = np.arange(1.0, 9.0)
    X = np.stack([v, -v, 2 * v, -2 * v])
    rep = report_metrics(X, "all")
    assert set(rep.undefined) == {"cos_to_mean", "alpha_req"}  # alpha_req: rank one
    assert "mean token is zero" in rep.undefined["cos_to_mean"]
    row = rep.rows()
    assert row["cos_to_mean"] is None and row["undefined"] == rep.undefined
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
    with pytest.raises(MemoryLimitError, match=r"^max_memory 1 GiB is exceeded: .*dirichlet_energy.*GiB"):
        compute_metrics(X, ["dirichlet_energy"], max_memory="1GiB")
    rep = report_metrics(X, ["mu", "avg_cos", "dirichlet_energy"], max_memory="1GiB")
    assert rep.rows()["mu"] == 0.0 and rep.undefined["dirichlet_energy"].startswith("the memory limit 1 GiB is exceeded: ")
    assert rep.rows()["avg_cos"] == 1.0  # the d-dimensional form: O(N d) memory, not refused


def test_guard_sizes_the_chunked_path_not_the_dense_one():
    """Past PAIR_BUDGET the cosine averages run in d-dimensional forms and row chunks:
    a limit far below the dense (N, N) matrices still lets all O(N d) metrics through,
    with the float64 values of the dense formulas (numpy reference)."""
    from rankcollapse.metrics.registry import metrics_bytes

    n, d = 3000, 16  # (N, N) float64 = 72 MB > PAIR_BUDGET (64 MiB): chunked path
    rng = np.random.default_rng(5)
    X = rng.standard_normal((n, d)) + 0.5 * rng.standard_normal(d)
    limit = 150 * 10**6  # dense needs 3 (N, N) float64 = 216 MB
    assert metrics_bytes(X.shape, ["dirichlet_energy"], 8) == (5 * n * d * 8 + 3 * n * n * 8, True)
    with pytest.raises(MemoryLimitError, match="mean_average_distance"):
        compute_metrics(X, ["avg_abs_cos", "mean_average_distance"], max_memory=limit)
    names = ("mu", "mu_relative", "avg_cos", "avg_abs_cos", "cos_to_mean", "numerical_rank", "rank_fraction",
             "sigma_min", "sigma_ratio", "stable_rank", "effective_rank", "rank_one_distance")
    got = compute_metrics(X, names, max_memory=limit)
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    C = U @ U.T  # the dense float64 reference, built here and not by the guarded path
    off = ~np.eye(n, dtype=bool)
    expect = {"avg_cos": C[off].mean(), "avg_abs_cos": np.abs(C[off]).mean()}
    for name in names:
        value = expect[name] if name in expect else getattr(ref, name)(X)
        assert float(got[name]) == pytest.approx(value, rel=1e-9, abs=1e-12), name


def test_guard_at_65536_tokens_estimates_o_n_d():
    from rankcollapse.metrics.registry import metrics_bytes

    shape = (1, 65_536, 64)
    est, dense = metrics_bytes(shape, ["mu", "avg_cos", "avg_abs_cos", "sigma_min", "effective_rank"], 4)
    assert not dense and est < 200 * 2**20  # 144 MiB, far from the 48 GiB of (N, N) matrices
    est, dense = metrics_bytes(shape, ["avg_cos", "mean_average_distance"], 4)
    assert dense and est > 48 * 2**30


def test_cluster_count_is_sized_as_a_dense_pairwise_metric():
    """n_clusters links tokens through their (N, N) cosine matrix: a limit below it makes it
    undefined with the estimate, while the O(N d) metrics are still computed."""
    from rankcollapse.metrics.registry import metrics_bytes

    n, d = 300, 3
    assert metrics_bytes((n, d), ["n_clusters"], 8) == (5 * n * d * 8 + 3 * n * n * 8, True)
    X = np.random.default_rng(0).standard_normal((n, d))
    rep = report_metrics(X, ["mu", "n_clusters"], max_memory="1MiB")  # (N, N) float64 alone: 0.7 MB, 3 of them 2.2 MB
    assert rep.undefined["n_clusters"].startswith("the memory limit 1 MiB is exceeded: ")
    assert float(rep.rows()["mu"]) == pytest.approx(float(ref.mu(X)), rel=1e-12)
    with pytest.raises(MemoryLimitError, match="n_clusters"):
        compute_metrics(X, ["n_clusters"], max_memory="1MiB")


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
