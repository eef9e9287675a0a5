"""Graph analysis of a mask (spec.md §4; docs/masks.md, "Analysis"): connectivity, centers,
radius, diameter of the digraph with an edge ``j -> i`` whenever ``M[i, j]``. Radius and
diameter are exact, by the eccentricity bounding scheme of Takes & Kosters
(Algorithms 6, 2013): after a forward and a backward BFS from ``v``, every ``u`` has
``max(d(u, v), ecc(v) - d(v, u)) <= ecc(u) <= d(u, v) + ecc(v)``; the search stops when no
unexplored center can beat the best radius (nor, when strongly connected, exceed the best diameter).
On a dense mask the BFS after the first run bottom-up on large frontiers (:class:`_Distances`).
Drawing a mask (:func:`draw_mask`): query tokens on the vertical axis, key tokens across.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

from .._display import NotebookResult
from .._figure import new_axes, save_figure
from .._memory import check_memory
from .._validate import check_int
from ..errors import MaskError
from . import interval_graph
from .mask import Mask


def bfs_distances(graph: sp.csr_array, source: int) -> np.ndarray:
    """Hop distance (int64 ``(N,)``, -1 = unreachable) from ``source`` along the edges
    ``u -> v`` with ``graph[u, v] != 0``: a BFS tree turned into depths by pointer jumping.
    Raises :class:`MaskError` for a non-square or non-sparse ``graph`` or ``source`` not a node.
    """
    if not sp.issparse(graph) or graph.ndim != 2 or graph.shape[0] != graph.shape[1]:
        raise MaskError(f"graph must be a square scipy sparse matrix, got {type(graph).__name__}")
    source = check_int(source, "source", low=0, high=graph.shape[0] - 1, error=MaskError)
    return _tree_depths(graph, source)


def _tree_depths(graph: sp.csr_array, source: int) -> np.ndarray:
    """:func:`bfs_distances` of a checked ``graph`` and ``source`` (float64 data: csgraph copies nothing)."""
    n = graph.shape[0]
    order, pred = csgraph.breadth_first_order(graph, source, directed=True, return_predecessors=True)
    dist = np.full(n, -1, dtype=np.int64)
    anc = pred[order].astype(np.int64)
    anc[0] = source  # order[0] is the source
    pos = np.full(n, -1, dtype=np.int64)
    pos[order] = np.arange(order.shape[0])
    depth = np.ones(order.shape[0], dtype=np.int64)
    depth[0] = 0
    up = pos[anc]  # position of each node's current ancestor in ``order``
    while True:
        todo = up != 0
        if not todo.any():
            break
        depth[todo] += depth[up[todo]]
        up = np.where(todo, up[up], up)
    dist[order] = depth
    return dist


#: a level goes bottom-up when its frontier's out-edges times this exceed the unvisited nodes'
#: in-edges (Beamer, Asanovic & Patterson, SC 2012: alpha = 14)
_BOTTOM_UP_ALPHA = 14
#: index entries one bottom-up round gathers at most
_BOTTOM_UP_BLOCK = 1 << 20


class _Distances:
    """Hop distances from one source along the edges ``u -> v`` of ``out`` (row ``u`` lists ``v``;
    ``into`` is its transpose, both canonical CSR; ``ones`` float64 ``(E,)`` data they share).

    The first source goes through csgraph's BFS, O(E). When it shows few levels (``ecc * N < E``:
    a dense mask), later sources take a level-synchronous BFS that runs bottom-up on large frontiers:
    each unvisited node scans its in-neighbours only until one is in the frontier, a few entries on
    a dense mask instead of its whole in-degree, so a source costs about O(N), not O(E)."""

    def __init__(self, out: sp.csr_array, into: sp.csr_array, ones: np.ndarray) -> None:
        self.graph = sp.csr_array((ones, out.indices, out.indptr), shape=out.shape)
        self.graph.has_sorted_indices = self.graph.has_canonical_format = True
        self.out_ptr, self.out_idx = out.indptr.astype(np.int64), out.indices
        self.in_ptr, self.in_idx = into.indptr.astype(np.int64), into.indices
        self.out_deg, self.in_deg = np.diff(self.out_ptr), np.diff(self.in_ptr)
        self.by_levels = False

    def __call__(self, source: int) -> np.ndarray:
        if self.by_levels:
            return self._levels(source)
        dist = _tree_depths(self.graph, source)
        self.by_levels = int(dist.max()) * dist.shape[0] < self.out_idx.shape[0]
        return dist

    def _levels(self, source: int) -> np.ndarray:
        n = self.out_deg.shape[0]
        dist = np.full(n, -1, dtype=np.int64)
        dist[source] = 0
        frontier, level, unvisited = np.array([source], dtype=np.int64), 0, None
        unvisited_in = int(self.in_deg.sum()) - int(self.in_deg[source])  # in-edges of unvisited nodes
        while frontier.size:
            level += 1
            if int(self.out_deg[frontier].sum()) * _BOTTOM_UP_ALPHA > unvisited_in:
                unvisited = np.flatnonzero(dist < 0) if unvisited is None else unvisited[dist[unvisited] < 0]
                in_frontier = np.zeros(n, dtype=bool)
                in_frontier[frontier] = True
                frontier = unvisited[_any_in(self.in_ptr, self.in_idx, unvisited, in_frontier)]
            else:
                starts, counts = self.out_ptr[frontier], self.out_deg[frontier]
                at = np.arange(int(counts.sum())) + np.repeat(starts - (np.cumsum(counts) - counts), counts)
                reached = self.out_idx[at]
                reached = reached[dist[reached] < 0]
                if reached.shape[0] * 8 > n:  # many: a bool mark in O(N) beats sorting
                    seen = np.zeros(n, dtype=bool)
                    seen[reached] = True
                    frontier = np.flatnonzero(seen)
                else:
                    frontier = np.unique(reached).astype(np.int64)
            dist[frontier] = level
            unvisited_in -= int(self.in_deg[frontier].sum())
        return dist


def _any_in(ptr: np.ndarray, idx: np.ndarray, nodes: np.ndarray, member: np.ndarray) -> np.ndarray:
    """Whether each of ``nodes`` has a neighbour (CSR ``ptr``, ``idx``) in the bool set ``member``:
    the lists are scanned in chunks of doubling width, each stopping at its first hit."""
    pos, end = ptr[nodes], ptr[nodes + 1]
    hit = np.zeros(nodes.shape[0], dtype=bool)
    todo, width = np.flatnonzero(pos < end), 4
    while todo.size:
        step = max(1, _BOTTOM_UP_BLOCK // width)
        for s in range(0, todo.shape[0], step):
            rows = todo[s:s + step]
            at = pos[rows, None] + np.arange(width)  # (rows, width)
            ok = at < end[rows, None]
            hit[rows[(member[idx[np.where(ok, at, 0)]] & ok).any(axis=1)]] = True
        pos[todo] += width
        todo = todo[~hit[todo] & (pos[todo] < end[todo])]
        width *= 2
    return hit


@dataclass
class MaskAnalysis(NotebookResult):
    """Graph facts of a mask (spec.md §4).

    ``centers``: the tokens from which every token is reachable (the source strong component);
    ``radius`` ``min_c max_i d(c, i)`` (None when not QSC); ``diameter`` ``max_{u, v} d(u, v)``
    (None when not strongly connected); ``distance_from_center`` int64 ``(N,)`` from ``best_center``;
    ``reason``: why the mask is not QSC.
    """

    spec: str
    n_tokens: int
    n_edges: int
    density: float
    self_loops: bool
    n_self_loops: int
    strongly_connected: bool
    quasi_strongly_connected: bool
    n_strong_components: int
    centers: list[int]
    radius: int | None
    diameter: int | None
    best_center: int | None
    in_degree: dict[str, float]
    out_degree: dict[str, float]
    source_components: list[list[int]]
    reason: str | None
    n_bfs: int
    closed_form_agrees: bool | None = None
    method: str = "csr"
    distance_from_center: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self, *, per_token: bool = False) -> dict[str, Any]:
        """JSON-ready dict; ``per_token`` adds ``distance_from_center``."""
        out = {k: v for k, v in self.__dict__.items() if k != "distance_from_center"}
        if per_token:
            d = self.distance_from_center
            out["distance_from_center"] = None if d is None else d.tolist()
        return out

    def to_pandas(self, *, per_token: bool = False) -> Any:
        """One row of the scalar facts; ``per_token``: one row per token, columns ``token,
        distance_from_center`` (-1 = unreachable or not QSC) and ``is_center``."""
        if not per_token:
            return super().to_pandas()
        import pandas as pd

        d = self.distance_from_center
        dist = np.full(self.n_tokens, -1, dtype=np.int64) if d is None else np.asarray(d, dtype=np.int64)
        tokens = np.arange(self.n_tokens)
        return pd.DataFrame({"token": tokens, "distance_from_center": dist,
                             "is_center": np.isin(tokens, np.asarray(self.centers, dtype=np.int64))})


def _degree_stats(deg: np.ndarray) -> dict[str, float]:
    return {"min": int(deg.min()), "mean": float(deg.mean()), "max": int(deg.max())}


def _eccentricity_search(
    dist_from: Callable[[int], np.ndarray], dist_to: Callable[[int], np.ndarray] | None, out_deg: np.ndarray,
    self_loop: np.ndarray, centers: np.ndarray, need_diameter: bool,
) -> tuple[int, int, np.ndarray, int | None, int]:
    """Exact radius over ``centers`` (and diameter if asked) by eccentricity bounds (``dist_to`` None:
    symmetric): ``(radius, best_center, its distances, diameter or None, BFS count)``."""
    m, n = centers.shape[0], out_deg.shape[0]
    # exact local facts: a center whose out-edges reach all N tokens (self-loop
    # counted) has ecc 1, any other has ecc >= 2 (N > 1)
    out_deg = out_deg[centers]
    reach_all = out_deg - self_loop[centers] == n - 1
    lo = np.where(reach_all, 1, min(2, n - 1)).astype(np.int64)
    hi = np.where(reach_all, 1, np.iinfo(np.int64).max // 4).astype(np.int64)
    done = np.zeros(m, dtype=bool)
    best_r, best_c, best_dist, best_d = None, -1, None, -1
    n_bfs, turn = 0, 0
    pick = int(np.argmax(out_deg))
    while True:
        v = int(centers[pick])
        dist_from_v = dist_from(v)
        dist_to_v = dist_from_v if dist_to is None else dist_to(v)
        n_bfs += 1 if dist_to is None else 2
        ecc = int(dist_from_v.max())
        to_v, from_v = dist_to_v[centers], dist_from_v[centers]
        lo = np.maximum(lo, np.maximum(to_v, ecc - from_v))
        hi = np.minimum(hi, to_v + ecc)
        lo[pick] = hi[pick] = ecc
        done[pick] = True
        if best_r is None or ecc < best_r:
            best_r, best_c, best_dist = ecc, v, dist_from_v
        best_d = max(best_d, ecc)
        radius_open = ~done & (lo < best_r)
        diameter_open = ~done & (hi > best_d) if need_diameter else np.zeros(m, dtype=bool)
        open_ = radius_open | diameter_open
        if not open_.any():
            break
        turn += 1
        pick = _next_pick(turn, radius_open, diameter_open, lo, hi, from_v, done, out_deg)
    return best_r, best_c, best_dist, (best_d if need_diameter else None), n_bfs


def _next_pick(turn, radius_open, diameter_open, lo, hi, from_v, done, out_deg) -> int:
    """Cycle: twice the least connected center farthest from the last source (the periphery,
    where bounds are tightest), then the smallest lower bound, then the largest upper bound."""
    step = turn % 4
    if step == 2 and radius_open.any():
        cand = np.flatnonzero(radius_open)
        return int(cand[np.argmin(lo[cand])])
    if step == 3 and diameter_open.any():
        cand = np.flatnonzero(diameter_open)
        cand = cand[hi[cand] == hi[cand].max()]
        return int(cand[np.argmin(out_deg[cand])])
    cand = np.flatnonzero(~done)
    cand = cand[from_v[cand] == from_v[cand].max()]
    return int(cand[np.argmin(out_deg[cand])])


#: Bytes of the CSR path: the mask's CSR and its transpose, the search's copies.
BYTES_PER_EDGE, BYTES_PER_TOKEN = 16, 64


def csr_analysis_bytes(mask: Mask) -> int | None:
    """Bytes the CSR path needs for ``mask``; None when the CSR exists or the edge count is unknown."""
    if mask.n_edges_hint is None or mask.is_built:
        return None
    return BYTES_PER_EDGE * mask.n_edges_hint + BYTES_PER_TOKEN * mask.n_tokens


def analyze(mask: Mask, *, method: str = "auto", max_memory: int | str | None = None) -> MaskAnalysis:
    """Analyse the graph of ``mask`` (spec.md §4) exactly, in O(E) memory.

    ``mask``: a Mask or bool ``(N, N)`` matrix. ``method="auto"`` analyses monotone interval masks
    from their intervals in O(N log N) (:mod:`.interval_graph`), others on the CSR form;
    ``"csr"`` always takes the CSR path. Both exact.

    Raises :class:`MaskError` for an invalid mask matrix (:meth:`Mask.from_dense`) or ``method``;
    :class:`MemoryLimitError` when the CSR path would need more than ``max_memory`` (bytes or
    ``"8GiB"``; default half the RAM), estimated before the CSR is built (:func:`csr_analysis_bytes`).

    See Also
    --------
    parse_mask : build the mask from a spec string.
    rankcollapse.theory.theorem1_terms : Theorem 1's terms (radius, scrambling length) of a
        mask or schedule.

    Examples
    --------
    >>> from rankcollapse.masks import causal, causal_sliding_window, parse_mask
    >>> a = analyze(causal(5))  # every token attends to token 0: center 0, radius 1
    >>> a.quasi_strongly_connected, a.centers, a.radius
    (True, [0], 1)
    >>> analyze(causal_sliding_window(5, 2)).radius  # token 0 reaches one more token per layer
    4
    >>> analyze(parse_mask("block:size=2", 4)).quasi_strongly_connected  # two islands
    False
    """
    if not isinstance(mask, Mask):
        mask = Mask.from_dense(mask)
    if method not in ("auto", "csr"):
        raise MaskError(f"method must be 'auto' or 'csr', got {method!r}")
    iv = mask.intervals
    if method == "auto" and iv is not None and interval_graph.is_monotone_interval(*iv):
        return _analyze_intervals(mask, *iv)
    need = csr_analysis_bytes(mask)
    if need is not None:
        check_memory(need, f"the graph analysis of mask {mask.spec!r} at N = {mask.n_tokens}", max_memory)
    csr = mask.to_csr()
    n_comp, labels = csgraph.connected_components(csr, directed=True, connection="strong")
    # the source components, which no edge enters from another: entry (i, j) of M is the edge j -> i,
    # so the component of i has an incoming edge if labels[i] != labels[j]
    row_labels = np.repeat(labels.astype(np.int32), np.diff(csr.indptr))
    col_labels = labels[csr.indices]
    has_in = np.zeros(n_comp, dtype=bool)
    has_in[row_labels[row_labels != col_labels]] = True
    members = [np.flatnonzero(labels == s) for s in np.flatnonzero(~has_in)]

    def search(centers: np.ndarray) -> tuple:
        fwd = csr.T.tocsr()
        symmetric = csr.nnz == fwd.nnz and (csr != fwd).nnz == 0
        ones = np.ones(csr.nnz)
        return _eccentricity_search(
            _Distances(fwd, csr, ones), None if len(centers) == 1 or symmetric else _Distances(csr, fwd, ones),
            np.diff(fwd.indptr), fwd.diagonal().astype(bool), centers, n_comp == 1)

    out_deg = np.bincount(csr.indices, minlength=mask.n_tokens)
    return _analysis(mask, members, n_comp, np.diff(csr.indptr), out_deg, csr.diagonal(), search, "csr")


def closed_form_agrees(mask: Mask, result: MaskAnalysis) -> bool | None:
    """Whether ``result`` agrees with the mask's closed form (None if it has none)."""
    cf = mask.closed_form
    if cf is None:
        return None
    checks = [cf["quasi_strongly_connected"] == result.quasi_strongly_connected,
              cf["strongly_connected"] == result.strongly_connected,
              np.array_equal(cf["centers"], result.centers), cf["radius"] == result.radius]
    if "diameter" in cf:  # omitted where no closed form is known
        checks.append(cf["diameter"] == result.diameter)
    return bool(all(checks))


def _analyze_intervals(mask: Mask, lo: np.ndarray, hi: np.ndarray) -> MaskAnalysis:
    """:func:`analyze` of a monotone interval mask from its intervals."""
    rlo, rhi = interval_graph.reverse(lo, hi)
    starts, ends, is_source = interval_graph.components(lo, hi)
    members = [np.arange(s, e + 1) for s, e in zip(starts[is_source], ends[is_source])]
    loops = np.ones(mask.n_tokens, dtype=bool)

    def search(centers: np.ndarray) -> tuple:
        symmetric = np.array_equal(lo, rlo) and np.array_equal(hi, rhi)
        return _eccentricity_search(
            lambda v: interval_graph.distances(lo, hi, v),
            None if len(centers) == 1 or symmetric else (lambda v: interval_graph.distances(rlo, rhi, v)),
            rhi - rlo + 1, loops, centers, starts.shape[0] == 1)

    return _analysis(mask, members, starts.shape[0], hi - lo + 1, rhi - rlo + 1, loops, search, "intervals")


def _analysis(mask: Mask, members: list[np.ndarray], n_comp: int, in_deg: np.ndarray, out_deg: np.ndarray,
              loops: np.ndarray, search: Callable[[np.ndarray], tuple], method: str) -> MaskAnalysis:
    """The :class:`MaskAnalysis` of a mask with source components ``members`` (``search`` runs when QSC)."""
    n, qsc = mask.n_tokens, len(members) == 1
    centers = members[0] if qsc else np.zeros(0, dtype=np.int64)
    radius, best_c, dist, diameter, n_bfs = search(centers) if qsc else (None, None, None, None, 0)
    n_edges = int(in_deg.sum())
    reason = None
    if not qsc:  # two or more source components
        a, b = int(members[0][0]), int(members[1][0])
        reason = (f"not quasi-strongly connected: {len(members)} source components (first tokens "
                  f"{[int(m[0]) for m in members[:10]]}); token {b} is not reachable from token {a}, and no token "
                  f"reaches both components")
    result = MaskAnalysis(
        spec=mask.spec, n_tokens=n, n_edges=n_edges, density=n_edges / float(n) ** 2,
        self_loops=bool(loops.all()), n_self_loops=int(loops.sum()), strongly_connected=n_comp == 1,
        quasi_strongly_connected=qsc, n_strong_components=int(n_comp), centers=centers.tolist(),
        radius=radius, diameter=diameter, best_center=best_c, in_degree=_degree_stats(in_deg),
        out_degree=_degree_stats(out_deg), source_components=[m.tolist() for m in members],
        reason=reason, n_bfs=n_bfs, distance_from_center=dist, method=method,
    )
    result.closed_form_agrees = closed_form_agrees(mask, result)
    return result


def image_format(out: str | Path) -> str:
    """The matplotlib format of ``out``'s suffix (default ``png``); :class:`MaskError` if
    matplotlib cannot write it."""
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = Path(out).suffix.lstrip(".").lower() or "png"
    known = FigureCanvasBase.get_supported_filetypes()
    if fmt not in known:
        raise MaskError(f"out {str(out)!r}: cannot write images of format {fmt!r}; "
                        f"use one of {', '.join(sorted(known))}")
    return fmt


def draw_mask(mask: Mask, analysis: MaskAnalysis | None = None, out: str | Path | None = None, *,
              ax: Any = None) -> Any:
    """Draw ``mask`` (dark cell ``(i, j)`` = query i attends to key j, centers in red); returns
    the figure, drawn on ``ax`` if given. ``analysis`` defaults to :func:`analyze` of ``mask``.
    ``out``: also write the image there (format from the suffix; :func:`image_format`)."""
    if out is not None:
        image_format(out)
    if analysis is None:
        analysis = analyze(mask)
    n = mask.n_tokens
    dense = mask.to_numpy()
    size = min(9.0, 3.0 + n / 16)
    fig, ax = new_axes(ax, figsize=(size, size))
    ax.imshow(dense, cmap="Greys", vmin=0, vmax=1.4, interpolation="nearest", origin="upper")
    centers = np.asarray(analysis.centers, dtype=int)
    if centers.size:
        ax.scatter(centers, np.full(centers.size, -0.5 - n * 0.02), marker="v", color="crimson",
                   s=18, clip_on=False, label="centers")
        ax.scatter(np.full(centers.size, -0.5 - n * 0.02), centers, marker=">", color="crimson",
                   s=18, clip_on=False)
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, -0.14), frameon=False, fontsize=8)
    status = f"QSC, radius {analysis.radius}" if analysis.quasi_strongly_connected else "not QSC"
    if analysis.diameter is not None:
        status += f", diameter {analysis.diameter}"
    ax.set_title(f"{mask.spec}\nN = {n}; {status}", fontsize=9)
    ax.set(xlabel="key token j", ylabel="query token i  (M[i, j]: i attends to j)",
           xlim=(-0.5 - n * 0.04, n - 0.5), ylim=(n - 0.5, -0.5 - n * 0.04))
    fig.tight_layout()
    if out is not None:
        save_figure(fig, out, dpi=120)
    return fig
