"""Property test of the public API: for generated good and bad arguments, a call
returns or raises one of the project's error classes (ValueError/TypeError
subclasses naming the argument), never OverflowError, EOFError, ZeroDivisionError,
AttributeError or a backend's RuntimeError."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankcollapse import masks, metrics, theory
from rankcollapse.data import Windows
from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.errors import RankCollapseError
from rankcollapse.masks.convert import to_block_mask

BUDGET = settings(max_examples=40, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

NUMBERS = st.sampled_from([1, 2, 3, 5, 0, -1, 2**70 + 1, -(2**70), 1.5, math.nan, math.inf, -math.inf,
                           "3", "\u00b2", None, True, np.int64(4), np.float64(2.0)])
POSITIVE_FLOATS = st.sampled_from([1.0, 0.5, 2, 0.0, -1.0, math.nan, math.inf, "1", None, 1e308])


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except RankCollapseError as exc:
        assert isinstance(exc, (ValueError, TypeError)) and str(exc)
        return None


@BUDGET
@given(st.sampled_from(["complete", "causal", "sliding_window", "causal_sliding_window", "prefix"]), NUMBERS, NUMBERS)
def test_mask_constructors(kind, n, w):
    spec = {"complete": "complete", "causal": "causal", "sliding_window": f"sliding_window:w={w}",
            "causal_sliding_window": f"causal_sliding_window:w={w}", "prefix": f"prefix:k={w}"}[kind]
    _call(masks.parse_mask, spec, n)
    if kind == "sliding_window":
        _call(masks.sliding_window, n, w)


@BUDGET
@given(NUMBERS)
def test_block_size(block_size):
    pytest.importorskip("torch.nn.attention.flex_attention")
    if not (isinstance(block_size, int) and not isinstance(block_size, bool) and 1 <= block_size <= 64):
        _call(to_block_mask, masks.causal(16), block_size=block_size)


@BUDGET
@given(st.sampled_from([(6, 4), (2, 5, 3), (0, 3), (4,), (3, 3)]),
       st.sampled_from([1.0, 0.0, 1e300, math.nan, math.inf]),
       st.sampled_from([None, torch.float64, torch.float32, "float64", "float32", "int8", 3, torch.int64]),
       st.sampled_from([None, 0.5, 0.0, -1.0, math.nan, math.inf, "x"]),
       st.sampled_from([None, ["mu"], ["numerical_rank"], "all", ["bogus"], []]))
def test_compute_metrics(shape, scale, dtype, rtol, names):
    X = np.random.default_rng(0).standard_normal(shape) * scale
    out = _call(metrics.compute_metrics, X, names, dtype=dtype, rank_rtol=rtol)
    if out is not None and rtol is not None and scale == 1.0 and names == ["numerical_rank"]:
        svals = np.linalg.svd(X, compute_uv=False)
        expect = (svals > svals[..., :1] * rtol).sum(-1)
        assert np.array_equal(out["numerical_rank"].numpy(), expect)
    rep = _call(metrics.report_metrics, X, names, dtype=dtype, rank_rtol=rtol)
    if rep is not None:
        for row in rep.rows() if rep.batched else [rep.rows()]:
            assert all(v is None or math.isfinite(v) for k, v in row.items() if k != "undefined")


@BUDGET
@given(NUMBERS, NUMBERS, NUMBERS, NUMBERS)
def test_equilibria(n, d, rank, limit):
    if all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 4 for v in (n, d, rank)):
        _call(theory.equilibria, n, d, rank, limit=limit, stability=False)
    else:
        _call(theory.equilibria, n, d, rank, limit=limit, stability=False)


@BUDGET
@given(NUMBERS, POSITIVE_FLOATS, st.sampled_from(["causal", "complete", "bogus", "sliding_window:w=3"]))
def test_simulate(depth, d_qk, mask):
    if isinstance(depth, (int, np.integer)) and not isinstance(depth, bool) and depth > 5:
        depth = 5
    X0 = np.random.default_rng(0).standard_normal((2, 6, 4))
    run = _call(RunConfig, depth=depth)  # a bad depth is refused by the run's config
    if run is not None:
        _call(simulate, X0, mask, run=run, d_qk=d_qk)


def test_file_readers_refuse_bad_files(tmp_path):
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    np.save(tmp_path / "text.npy", np.array(["a"]))
    for path in (empty, tmp_path / "text.npy", tmp_path / "missing.npy", tmp_path):
        assert _call(masks.from_file, path, 4) is None
        assert _call(Windows.load, path) is None


def test_issue_examples_are_typed():
    from rankcollapse.errors import ConfigError, MaskError, MetricError

    with pytest.raises(MaskError, match="w"):
        masks.sliding_window(16, 2**70 + 1)
    with pytest.raises(MaskError, match="block_size"):
        to_block_mask(masks.causal(8), block_size=0)
    with pytest.raises(MetricError, match="rank_rtol"):
        metrics.compute_metrics(np.eye(3), ["numerical_rank"], rank_rtol=float("nan"))
    with pytest.raises(ConfigError, match="limit"):
        theory.equilibria(2, 2, 2, limit=-1)
    X = np.eye(3)
    assert float(metrics.compute_metrics(X, ["numerical_rank"], dtype="float64")["numerical_rank"]) == 3.0
