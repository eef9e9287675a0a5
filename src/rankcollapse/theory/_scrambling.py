"""The search for a schedule's scrambling length ``L`` (docs/theory.md §7); the quantity
itself is public in :mod:`.envelope` (:func:`~.envelope.scrambling_length`).

``L`` is the least length such that every window of ``L`` consecutive layers, at any
phase, composes to a graph with a full column (a token reaching every token). With
self-loops in every layer a window's composed graph only grows with its length, so
``L = max_s L(s)``, ``L(s)`` the least rooted length of the windows starting at phase
``s``; every window of ``p (r_H + 1) - 1`` layers is rooted, which caps the search.

Two exact paths:

- every layer a monotone interval mask (windows, causal, complete, prefix, blocks,
  documents): windows compose as intervals in O(N) per layer and a full column is the
  O(1) test ``lo[N-1] <= hi[0]`` (:mod:`rankcollapse.masks.interval_graph`);
- otherwise sparse boolean products restricted to the columns of the candidate roots,
  the centers of the union of the layer graphs (a root of any window reaches every token
  along the union's edges, so it is one of them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .._memory import check_memory


def _interval_window(layers: list[tuple[np.ndarray, np.ndarray]], start: int, cap: int) -> int | None:
    from ..masks import interval_graph

    p = len(layers)
    prod = layers[start % p]
    for length in range(1, cap + 1):
        if interval_graph.has_full_column(*prod):
            return length
        prod = interval_graph.compose(layers[(start + length) % p], prod)
    return None


def _rooted(columns: sp.csr_array, n: int) -> bool:
    """Whether one of the (candidate) columns of a boolean product is all True."""
    return bool(columns.nnz) and int(np.bincount(columns.indices, minlength=columns.shape[1]).max()) == n


def _sparse_window(layers: list[sp.csr_array], candidates: np.ndarray, start: int, cap: int) -> int | None:
    p, n = len(layers), layers[0].shape[0]
    prod = layers[start % p][:, candidates]
    for length in range(1, cap + 1):
        if _rooted(prod, n):
            return length
        prod = layers[(start + length) % p] @ prod  # bool @ bool: scipy's boolean product
    return None


def _candidates(layers: list[sp.csr_array], max_memory: int | str | None) -> np.ndarray:
    """Centers of the union of the layer graphs (empty when it is not QSC)."""
    from ..masks import Mask, analyze

    union = layers[0]
    for c in layers[1:]:
        union = union + c  # bool + bool: logical or
    return np.asarray(analyze(Mask(union.shape[0], "union", csr=union), max_memory=max_memory).centers,
                      dtype=np.int64)


def scrambling_search(schedule: Any, radius: int, *, max_memory: int | str | None = None) -> int | None:
    """``L`` of a :class:`~rankcollapse.masks.MaskSchedule` whose layers all have self-loops
    and whose composed graph is QSC with radius ``radius`` (``r_H``); None if some phase
    has no rooted window within the cap (cannot happen under those assumptions).

    Raises
    ------
    MemoryLimitError
        The sparse path's products (``N`` × candidates entries at most) would exceed
        ``max_memory`` (default half the RAM).
    """
    p, n = schedule.period, schedule.n_tokens
    cap = p * (radius + 1) - 1
    intervals = schedule.intervals()
    if intervals is not None:
        windows = (_interval_window(intervals, s, cap) for s in range(p))
    else:
        layers = [sp.csr_array(m.to_csr(), dtype=bool) for m in schedule.masks]
        candidates = _candidates(layers, max_memory)
        check_memory(9.0 * n * len(candidates), f"the scrambling-length search of {schedule.spec!r} at N = {n}",
                     max_memory)
        windows = (_sparse_window(layers, candidates, s, cap) for s in range(p))
    best = 0
    for length in windows:
        if length is None:
            return None
        best = max(best, length)
    return best
