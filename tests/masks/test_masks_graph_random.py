"""Generic analysis against an independent networkx reference on random graphs."""

import networkx as nx
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rankcollapse.masks import Mask, analyze, bfs_distances


@st.composite
def edge_lists(draw):
    n = draw(st.integers(1, 14))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=4 * n))
    loops = draw(st.booleans())
    edges = pairs + ([(i, i) for i in range(n)] if loops else [])
    # every row needs a key: give keyless rows one drawn key
    rows = {i for i, _ in edges}
    for i in range(n):
        if i not in rows:
            edges.append((i, draw(st.integers(0, n - 1))))
    return n, edges


def _reference(n, edges):
    """networkx: centers from the condensation, radius/diameter from BFS eccentricities."""
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from((j, i) for i, j in edges)  # i attends to j = edge j -> i
    cond = nx.condensation(g)
    sources = [c for c in cond if cond.in_degree(c) == 0]
    centers = sorted(cond.nodes[sources[0]]["members"]) if len(sources) == 1 else []
    ecc = {c: max(nx.single_source_shortest_path_length(g, c).values()) for c in centers}
    radius = min(ecc.values()) if centers else None
    diameter = nx.diameter(g) if nx.is_strongly_connected(g) else None
    return centers, radius, diameter, len(sources), ecc


@given(edge_lists())
def test_analysis_matches_networkx(case):
    n, edges = case
    a = analyze(Mask.from_edges(np.array(edges, dtype=np.int64).reshape(-1, 2), n))
    centers, radius, diameter, n_sources, ecc = _reference(n, edges)
    assert a.centers == centers
    assert a.quasi_strongly_connected == bool(centers)
    assert a.radius == radius
    assert a.diameter == diameter
    assert a.strongly_connected == (a.n_strong_components == 1)
    assert len(a.source_components) == n_sources
    if centers:
        assert ecc[a.best_center] == radius
        assert a.distance_from_center.max() == radius
    else:
        assert a.reason is not None and a.distance_from_center is None


@given(edge_lists(), st.data())
def test_bfs_distances_match_networkx(case, data):
    n, edges = case
    m = Mask.from_edges(np.array(edges, dtype=np.int64).reshape(-1, 2), n)
    src = data.draw(st.integers(0, n - 1))
    dist = bfs_distances(m.to_csr().T.tocsr(), src)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from((j, i) for i, j in edges)
    ref = nx.single_source_shortest_path_length(g, src)
    assert dist.tolist() == [ref.get(i, -1) for i in range(n)]


def test_large_random_strongly_connected_radius_matches_networkx():
    from rankcollapse.masks import parse_mask

    m = parse_mask("random:p=0.02,seed=4", 400)
    a = analyze(m)
    g = nx.DiGraph([(int(j), int(i)) for i, j in zip(*np.nonzero(m.to_numpy()))])
    assert a.strongly_connected and nx.is_strongly_connected(g)
    assert a.radius == nx.radius(g) and a.diameter == nx.diameter(g)


def test_dense_mask_takes_one_csgraph_bfs_per_direction(monkeypatch):
    """A dense mask (few levels) runs csgraph's O(E) BFS once per direction; the other sources go
    through the level-synchronous BFS. Every field still equals networkx."""
    from scipy.sparse import csgraph

    from rankcollapse.masks import graph, parse_mask

    calls, bfs = [], csgraph.breadth_first_order

    def counting(*args, **kwargs):
        calls.append(args[1])
        return bfs(*args, **kwargs)

    monkeypatch.setattr(graph.csgraph, "breadth_first_order", counting)
    m = parse_mask("random:p=0.5,seed=0", 120)
    a = analyze(m)
    monkeypatch.undo()
    g = nx.DiGraph([(int(j), int(i)) for i, j in zip(*np.nonzero(m.to_numpy()))])
    assert len(calls) == 2 and a.n_bfs == 240  # every token a center, bounds never close below 2
    assert (a.radius, a.diameter) == (nx.radius(g), nx.diameter(g)) == (2, 2)


@given(edge_lists(), st.integers(0, 3))
def test_level_bfs_matches_csgraph_bfs(case, dense):
    """The level-synchronous BFS (top-down and bottom-up levels) gives csgraph's distances."""
    from rankcollapse.masks.graph import _Distances

    n, edges = case
    rng = np.random.default_rng(n)
    extra = np.argwhere(rng.random((n, n)) < dense / 4)  # denser graphs: bottom-up levels
    m = Mask.from_edges(np.concatenate([np.array(edges, dtype=np.int64).reshape(-1, 2), extra]), n)
    into = m.to_csr()  # row i: the j with edge j -> i
    out = into.T.tocsr()
    dist = _Distances(out, into, np.ones(into.nnz))
    dist.by_levels = True
    for src in range(n):
        assert dist(src).tolist() == bfs_distances(out, src).tolist()
