"""Analysis of a mask too large for the graph search, from its closed form.

The generic :func:`~rankcollapse.masks.graph.analyze` holds the CSR form and its
transpose, about 16 bytes per edge: 69 GB for ``complete`` at N = 65,536. Masks built
from per-row key intervals ``lo[i] .. hi[i]`` that record their centers, radius and
diameter in closed form (complete, causal, windows; spec.md §4 table) need no edge
list at all: degrees and self-loops follow from the intervals in O(N), and the strong
components are known when the mask is strongly connected (one component) or only
looks back (``hi[i] <= i``: every token is its own component). Other masks have no
such path and are refused by size.
"""

from __future__ import annotations

import numpy as np

from .._memory import check_memory
from ..errors import MemoryLimitError
from .graph import MaskAnalysis, _degree_stats
from .mask import Mask

#: CSR indices and data of the mask and of its transpose, plus the search's copies.
BYTES_PER_EDGE = 16
BYTES_PER_TOKEN = 64


def analysis_bytes(mask: Mask) -> int | None:
    """Memory the graph search needs for ``mask`` (bytes); None if the edge count is
    unknown without building the mask."""
    if mask.n_edges_hint is None:
        return None
    return BYTES_PER_EDGE * mask.n_edges_hint + BYTES_PER_TOKEN * mask.n_tokens


def closed_form_analysis(mask: Mask) -> MaskAnalysis | None:
    """:class:`MaskAnalysis` of ``mask`` without its edge list, or None when the mask
    has no interval form and closed form to build it from (module docstring).

    ``best_center`` is given only when the center is unique, and
    ``distance_from_center`` is not computed (None); ``method`` is ``"closed_form"``.
    """
    cf, iv = mask.closed_form, mask.intervals
    if cf is None or iv is None:
        return None
    n = mask.n_tokens
    lo, hi = iv
    idx = np.arange(n)
    centers = np.asarray(cf["centers"], dtype=np.int64)
    if cf["strongly_connected"]:
        n_comp, sources = 1, [idx.tolist()]
    elif bool((hi <= idx).all()):  # only looks back: a DAG plus self-loops
        n_comp, sources = n, [[int(i)] for i in np.flatnonzero(lo >= idx)[:n]]
    else:
        return None
    in_deg = np.maximum(hi - lo + 1, 0)
    cover = np.zeros(n + 1, dtype=np.int64)
    np.add.at(cover, lo, 1)
    np.add.at(cover, hi + 1, -1)
    out_deg = np.cumsum(cover[:n])
    diag = (lo <= idx) & (idx <= hi)
    n_edges = int(in_deg.sum())
    qsc = bool(cf["quasi_strongly_connected"])
    reason = None if qsc else f"not quasi-strongly connected: {len(sources)} source components"
    return MaskAnalysis(
        spec=mask.spec, n_tokens=n, n_edges=n_edges, density=n_edges / float(n) ** 2,
        self_loops=bool(diag.all()), n_self_loops=int(diag.sum()),
        strongly_connected=bool(cf["strongly_connected"]), quasi_strongly_connected=qsc,
        n_strong_components=n_comp, centers=centers.tolist(), radius=cf["radius"], diameter=cf["diameter"],
        best_center=int(centers[0]) if centers.size == 1 else None,
        in_degree=_degree_stats(in_deg), out_degree=_degree_stats(out_deg),
        source_components=sources, reason=reason, n_bfs=0, method="closed_form",
    )


def analyze_within(mask: Mask, max_memory: int | str | None = None) -> MaskAnalysis | None:
    """The closed-form analysis when the graph search would exceed ``max_memory``;
    None when the search fits (the caller runs it).

    Raises
    ------
    MemoryLimitError
        The search does not fit and the mask has no closed-form path.
    """
    need = analysis_bytes(mask)
    if need is None or mask.is_built:
        return None
    try:
        check_memory(need, f"the graph analysis of mask {mask.spec!r} at N = {mask.n_tokens}", max_memory)
    except MemoryLimitError:
        closed = closed_form_analysis(mask)
        if closed is None:
            raise
        return closed
    return None
