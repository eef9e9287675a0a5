"""Exact graph facts of *monotone interval* masks in O(N log N), without the CSR form
(docs/masks.md, "Interval masks without the CSR"): row ``i`` attends ``lo[i] .. hi[i]``,
``lo[i] <= i <= hi[i]``, ``lo`` and ``hi`` non-decreasing. Reached sets are intervals (fact 1:
one BFS step is two binary searches) and the reverse graph is again such a mask (:func:`reverse`)."""

from __future__ import annotations

import numpy as np


def is_monotone_interval(lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether ``lo[i] <= i <= hi[i]`` and ``lo``, ``hi`` are non-decreasing."""
    idx = np.arange(lo.shape[0])
    return bool((lo <= idx).all() and (hi >= idx).all() and (lo[1:] >= lo[:-1]).all() and (hi[1:] >= hi[:-1]).all())


def reverse(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of the reverse graph (row ``j``: the queries that attend ``j``), O(N):
    ``lo'[j] = min{i : hi[i] >= j}``, ``hi'[j] = max{i : lo[i] <= j}``."""
    n = lo.shape[0]
    rows, runs = np.arange(n), np.empty(n, dtype=np.int64)
    runs[0] = hi[0] + 1
    np.subtract(hi[1:], hi[:-1], out=runs[1:])
    lo_rev = np.repeat(rows, runs)
    np.subtract(lo[1:], lo[:-1], out=runs[:-1])
    runs[-1] = n - lo[-1]
    return lo_rev, np.repeat(rows, runs)


def distances(lo: np.ndarray, hi: np.ndarray, source: int) -> np.ndarray:
    """Hop distance (int64 ``(N,)``, -1 = unreachable) from ``source`` along ``j -> i`` (fact 1)."""
    n = lo.shape[0]
    a_steps, b_steps = [source], [source]
    a = b = source
    while True:
        b2 = int(np.searchsorted(lo, b, side="right")) - 1
        a2 = int(np.searchsorted(hi, a, side="left"))
        if a2 == a and b2 == b:
            break
        a, b = a2, b2
        a_steps.append(a)
        b_steps.append(b)
    dist = np.full(n, -1, dtype=np.int64)
    idx = np.arange(n)
    right = idx[source:b + 1]  # first step k with b_k >= i
    dist[source:b + 1] = np.searchsorted(np.asarray(b_steps), right, side="left")
    left = idx[a:source]  # first step k with a_k <= i (a_k non-increasing)
    dist[a:source] = np.searchsorted(-np.asarray(a_steps), -left, side="left")
    return dist


def components(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Strong components as runs (``p, p+1`` share one iff ``lo[p+1] <= p`` and ``hi[p] >= p + 1``):
    ``(starts, ends, is_source)``, ends inclusive; a run ``[s, e]`` is a source iff ``lo[s] = s``, ``hi[e] = e``."""
    n = lo.shape[0]
    p = np.arange(n - 1)
    cut = (lo[1:] > p) | (hi[:-1] < p + 1)
    starts = np.concatenate(([0], np.flatnonzero(cut) + 1))
    ends = np.concatenate((starts[1:] - 1, [n - 1]))
    return starts, ends, (lo[starts] == starts) & (hi[ends] == ends)


def compose(outer: tuple[np.ndarray, np.ndarray], inner: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of the boolean product ``M_outer M_inner`` of two monotone interval masks:
    ``[lo_i[lo_o[i]], hi_i[hi_o[i]]]`` (consecutive rows touch, having self-loops). O(N)."""
    (lo_o, hi_o), (lo_i, hi_i) = outer, inner
    return lo_i[lo_o], hi_i[hi_o]


def has_full_column(lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether some key is attended by every row: ``lo[N-1] <= hi[0]``."""
    return bool(lo[-1] <= hi[0])
