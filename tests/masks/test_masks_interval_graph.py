"""Analysis of monotone interval masks from their intervals equals the CSR path, and
reaches N = 1,048,576 without building the CSR form."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankcollapse.errors import MaskError
from rankcollapse.masks import Mask, analyze, parse_mask
from rankcollapse.masks.interval_graph import components, distances, is_monotone_interval, reverse


def _same(a, b):
    da, db = a.to_dict(per_token=True), b.to_dict(per_token=True)
    for key in da:
        if key in ("method", "n_bfs"):
            continue
        va, vb = da[key], db[key]
        if key == "source_components":
            va, vb = sorted(va), sorted(vb)
        assert va == vb, key


@st.composite
def monotone_intervals(draw):
    n = draw(st.integers(1, 60))
    lo_steps = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    hi_extra = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    lo = np.minimum(np.cumsum(lo_steps) - lo_steps[0], np.arange(n))  # non-decreasing, <= i
    lo = np.maximum.accumulate(lo)
    hi = np.minimum(np.maximum.accumulate(np.arange(n) + np.asarray(hi_extra)), n - 1)
    return lo.astype(np.int64), hi.astype(np.int64)


@settings(max_examples=150, deadline=None)
@given(monotone_intervals())
def test_intervals_path_equals_csr_path(iv):
    lo, hi = iv
    assert is_monotone_interval(lo, hi)
    m = Mask(lo.shape[0], "custom", intervals=(lo, hi))
    a, b = analyze(m), analyze(m, method="csr")
    assert a.method == "intervals" and b.method == "csr"
    _same(a, b)


@pytest.mark.parametrize("spec", ["complete", "causal", "sliding_window:w=5", "causal_sliding_window:w=4",
                                  "prefix:k=3", "block:size=4", "block:size=4,causal=true",
                                  "documents:lengths=5+9+9,causal=true", "sliding_window:w=1"])
def test_named_masks_both_paths_and_closed_forms(spec):
    m = parse_mask(spec, 23)
    a = analyze(m)
    assert a.method == "intervals" and a.closed_form_agrees is True
    _same(a, analyze(m, method="csr"))


def test_hand_built_pieces():
    # causal sliding window w=3 on 7 tokens: runs of length 1, source {0}
    lo, hi = np.maximum(np.arange(7) - 2, 0), np.arange(7)
    starts, ends, src = components(lo, hi)
    assert starts.tolist() == list(range(7)) and src.tolist() == [True] + [False] * 6
    assert distances(lo, hi, 0).tolist() == [0, 1, 1, 2, 2, 3, 3]
    assert distances(lo, hi, 3).tolist() == [-1, -1, -1, 0, 1, 1, 2]
    rlo, rhi = reverse(lo, hi)  # key j is attended by queries j .. j + 2
    assert rlo.tolist() == list(range(7)) and rhi.tolist() == [2, 3, 4, 5, 6, 6, 6]


def test_million_tokens_from_closed_forms_without_csr():
    n = 2**20
    for spec, radius, diameter in (("causal_sliding_window:w=256", -(-(n - 1) // 255), None),
                                   ("sliding_window:w=257", -(-(-(-(n - 1) // 2)) // 128), -(-(n - 1) // 128))):
        m = parse_mask(spec, n)
        a = analyze(m)
        assert (a.radius, a.diameter) == (radius, diameter)
        assert a.closed_form_agrees is True and a.n_edges == m.n_edges_hint
        assert m._csr is None  # the 268M-edge CSR form was never built


def test_bad_method():
    with pytest.raises(MaskError, match="method"):
        analyze(parse_mask("causal", 4), method="bfs")


def test_rate_table_at_a_million_tokens():
    from rankcollapse.theory.rates import compare_masks

    table = compare_masks(["causal_sliding_window:w=256", "causal"], 2**20)
    assert table["radius"].tolist() == [-(-(2**20 - 1) // 255), 1]
    assert table["max_in_degree"].tolist() == [256, 2**20]
