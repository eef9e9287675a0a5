"""Graph facts of the structured masks: spec.md §4 table, closed forms checked
against the generic algorithm on many sizes, and the CLI's JSON."""

import json
import math

import numpy as np
import pytest

from rankcollapse.masks import analyze, causal_sliding_window, parse_mask, sliding_window


@pytest.mark.parametrize("n", [2, 3, 9, 30, 101])
def test_theory_table(n):
    a = analyze(parse_mask("complete", n))
    assert (a.centers, a.radius, a.diameter) == (list(range(n)), 1, 1)
    a = analyze(parse_mask("causal", n))
    assert (a.centers, a.radius, a.quasi_strongly_connected, a.strongly_connected) == ([0], 1, True, False)
    for w in (2, 3, 4, 7):
        a = analyze(causal_sliding_window(n, w))
        assert a.centers == [0] and a.radius == math.ceil((n - 1) / (w - 1))
    for h in (1, 2, 5):
        a = analyze(sliding_window(n, 2 * h + 1))
        assert a.strongly_connected and a.centers == list(range(n))
        assert a.radius == math.ceil(math.ceil((n - 1) / 2) / h)
        assert a.diameter == math.ceil((n - 1) / h)
    for k in (1, 2, n - 1):
        a = analyze(parse_mask(f"prefix:k={k}", n))
        assert a.centers == list(range(k)) and a.radius == 1


def test_documents_not_qsc_with_reason():
    a = analyze(parse_mask("documents:lengths=3+5+8", 16))
    assert not a.quasi_strongly_connected and a.radius is None and a.diameter is None
    assert a.centers == [] and [c[0] for c in a.source_components] == [0, 3, 8]
    assert "token 3 is not reachable from token 0" in a.reason
    a = analyze(parse_mask("documents:lengths=3+5+8,causal=true", 16))
    assert a.source_components == [[0], [3], [8]]


def test_issue_example():
    a = analyze(parse_mask("causal_sliding_window:w=4", 9))
    assert a.radius == 3 and a.centers == [0]
    assert a.distance_from_center.tolist() == [0, 1, 1, 1, 2, 2, 2, 3, 3]


SIZES = [1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 64, 65]
SPECS = [
    "complete", "causal", "sliding_window:w=1", "sliding_window:w=3", "sliding_window:w=7",
    "causal_sliding_window:w=1", "causal_sliding_window:w=2", "causal_sliding_window:w=5",
    "dilated:w=3,dilation=1", "dilated:w=3,dilation=2", "dilated:w=4,dilation=3,causal=true",
    "prefix:k=1", "block:size=4", "block:size=4,causal=true", "block:size=100",
    "strided:stride=1", "strided:stride=2", "strided:stride=5", "fixed:stride=1,c=1",
    "fixed:stride=4,c=1", "fixed:stride=4,c=4", "fixed:stride=5,c=2",
    "longformer:w=3,globals=0", "longformer:w=5", "bigbird:w=3,globals=0,random=2,seed=1",
]


@pytest.mark.parametrize("spec", SPECS)
def test_closed_forms_agree_with_generic_analysis(spec):
    for n in SIZES:
        if spec.startswith("bigbird") and n < 2:
            continue  # random=2 keys need N >= 2
        m = parse_mask(spec, n)
        a = analyze(m)
        assert m.closed_form is not None
        assert a.closed_form_agrees, (spec, n, a.to_dict(), m.closed_form)


def test_distance_from_center_matches_networkx():
    import networkx as nx

    m = parse_mask("fixed:stride=4,c=1", 23)
    a = analyze(m)
    g = nx.DiGraph([(int(j), int(i)) for i, j in zip(*np.nonzero(m.to_numpy()))])
    d = nx.single_source_shortest_path_length(g, a.best_center)
    assert a.distance_from_center.tolist() == [d[i] for i in range(23)]


def test_degrees_density_self_loops():
    a = analyze(parse_mask("causal_sliding_window:w=3", 5))
    assert a.n_edges == 1 + 2 + 3 + 3 + 3
    assert a.in_degree == {"min": 1, "mean": 12 / 5, "max": 3}
    assert a.out_degree == {"min": 1, "mean": 12 / 5, "max": 3}  # token 4 is seen by itself only
    assert a.density == 12 / 25 and a.self_loops and a.n_self_loops == 5
    no_loop = np.ones((3, 3), dtype=bool)
    np.fill_diagonal(no_loop, False)
    b = analyze(no_loop)
    assert not b.self_loops and b.n_self_loops == 0 and b.radius == 1


def _cli(*args):
    from tests.cli._harness import run_cli

    return run_cli(*args)


def test_cli_describe_json_keys():
    res = _cli("mask", "describe", "causal_sliding_window:w=4", "--n-tokens", "9", "--format", "json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    for key in ("n_tokens", "n_edges", "self_loops", "strongly_connected",
                "quasi_strongly_connected", "centers", "radius", "diameter", "reason"):
        assert key in d
    assert (d["n_tokens"], d["radius"], d["centers"], d["diameter"]) == (9, 3, [0], None)
    res = _cli("mask", "describe", "block:size=3", "--n-tokens", "9", "--format", "json")
    d = json.loads(res.stdout)
    assert d["radius"] is None and d["quasi_strongly_connected"] is False and "not reachable" in d["reason"]
