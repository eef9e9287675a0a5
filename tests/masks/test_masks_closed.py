"""Closed-form analysis of masks too large for the graph search: same facts as the
search on sizes where both run; refused when no closed form exists."""

import numpy as np
import pytest

from rankcollapse import masks
from rankcollapse.errors import MemoryLimitError

FIELDS = ("n_edges", "density", "self_loops", "n_self_loops", "strongly_connected",
          "quasi_strongly_connected", "n_strong_components", "centers", "radius", "diameter",
          "in_degree", "out_degree", "source_components")


@pytest.mark.parametrize("spec", ["complete", "causal", "sliding_window:w=5", "causal_sliding_window:w=4",
                                  "sliding_window:w=1"])
@pytest.mark.parametrize("n", [1, 2, 7, 40])
def test_closed_form_matches_graph_search(spec, n):
    searched = masks.analyze(masks.parse_mask(spec, n))
    closed = masks.analyze(masks.parse_mask(spec, n), max_memory=1)
    assert searched.method == "graph_search" and closed.method == "closed_form"
    for f in FIELDS:
        assert getattr(closed, f) == getattr(searched, f), f


def test_huge_complete_mask_needs_no_edge_list():
    a = masks.analyze(masks.parse_mask("complete", 65536))
    assert a.method == "closed_form" and a.n_edges == 65536**2 and a.radius == 1
    assert a.in_degree == {"min": 65536, "mean": 65536.0, "max": 65536}


def test_mask_without_closed_form_refused_by_size():
    n = 50
    m = masks.Mask(n, "reversed_causal", intervals=(np.arange(n), np.full(n, n - 1)))  # no closed form
    with pytest.raises(MemoryLimitError, match="max-memory"):
        masks.analyze(m, max_memory=100)
