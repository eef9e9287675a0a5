"""Exact graph facts of *monotone interval* masks in O(N log N), without the CSR form.

A mask is a monotone interval mask when row ``i`` attends exactly the keys
``lo[i] .. hi[i]`` with ``lo[i] <= i <= hi[i]`` (self-loops) and ``lo``, ``hi``
non-decreasing: complete, causal, sliding and causal sliding windows, prefix, block and
document masks. Edges are ``j -> i`` for ``lo[i] <= j <= hi[i]`` (spec.md §4). Three
facts make every quantity of :func:`rankcollapse.masks.analyze` cheap:

1. **Reachable sets are intervals.** If the set reached from ``v`` after ``k`` steps is
   ``[a, b]``, one more step reaches ``{i : lo[i] <= b, hi[i] >= a}``, an interval by
   monotonicity: ``b' = max{i : lo[i] <= b}``, ``a' = min{i : hi[i] >= a}`` (two binary
   searches). A BFS from ``v`` therefore costs O(ecc(v) log N), and its distance vector
   O(N) to write out.
2. **Strong components are runs.** Information passes from ``p`` to ``p + 1`` iff
   ``lo[p+1] <= p`` (if not, no token ``>= p+1`` attends any token ``<= p``), and from
   ``p + 1`` to ``p`` iff ``hi[p] >= p + 1``; so ``p, p+1`` share a component iff both
   hold, and the components are the maximal runs between the cut points.
3. **Sources.** A run ``[s, e]`` has an entering edge iff some row in it attends
   outside it; by monotonicity iff ``lo[s] < s`` or ``hi[e] > e``.

The reverse graph (``i -> j``) is again a monotone interval mask, with
``lo'[j] = min{i : hi[i] >= j}`` and ``hi'[j] = max{i : lo[i] <= j}``, so backward
distances use the same expansion. Tests check every field against the CSR path.
"""

from __future__ import annotations

import numpy as np


def is_monotone_interval(lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether ``lo[i] <= i <= hi[i]`` and ``lo``, ``hi`` are non-decreasing."""
    idx = np.arange(lo.shape[0])
    return bool((lo <= idx).all() and (hi >= idx).all() and (lo[1:] >= lo[:-1]).all() and (hi[1:] >= hi[:-1]).all())


def reverse(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of the reverse graph: row ``j`` of it holds the queries that attend ``j``.

    ``lo'[j] = i`` for ``hi[i-1] < j <= hi[i]`` and ``hi'[j] = i`` for ``lo[i] <= j <
    lo[i+1]`` (``lo``, ``hi`` non-decreasing, ``lo[0] = 0``, ``hi[N-1] = N-1``): each row
    index repeated over its run, O(N)."""
    n = lo.shape[0]
    rows, runs = np.arange(n), np.empty(n, dtype=np.int64)
    runs[0] = hi[0] + 1
    np.subtract(hi[1:], hi[:-1], out=runs[1:])
    lo_rev = np.repeat(rows, runs)
    np.subtract(lo[1:], lo[:-1], out=runs[:-1])
    runs[-1] = n - lo[-1]
    return lo_rev, np.repeat(rows, runs)


def distances(lo: np.ndarray, hi: np.ndarray, source: int) -> np.ndarray:
    """Hop distance from ``source`` to every token along ``j -> i`` (``lo[i] <= j <= hi[i]``).

    Returns int64 ``(N,)``, ``-1`` where unreachable (fact 1 of the module docstring).
    """
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
    """Strong components (fact 2) as runs: ``(starts, ends, is_source)``, ends inclusive."""
    n = lo.shape[0]
    p = np.arange(n - 1)
    cut = (lo[1:] > p) | (hi[:-1] < p + 1)
    starts = np.concatenate(([0], np.flatnonzero(cut) + 1))
    ends = np.concatenate((starts[1:] - 1, [n - 1]))
    return starts, ends, (lo[starts] == starts) & (hi[ends] == ends)


def compose(outer: tuple[np.ndarray, np.ndarray], inner: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of the composed graph ``outer ∘ inner`` (boolean product ``M_outer M_inner``:
    ``i`` reaches key ``c`` iff ``i`` attends some ``j`` under ``outer`` that attends ``c``
    under ``inner``), both monotone interval masks.

    Row ``i`` of the product is the union of ``inner``'s rows ``lo_o[i] .. hi_o[i]``; they
    are monotone and each holds its own index (self-loops), so consecutive rows touch and
    the union is the interval ``[lo_i[lo_o[i]], hi_i[hi_o[i]]]``, again monotone with
    self-loops. O(N).
    """
    (lo_o, hi_o), (lo_i, hi_i) = outer, inner
    return lo_i[lo_o], hi_i[hi_o]


def has_full_column(lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether some key is attended by every row (a token reaching every token in one
    step): by monotonicity iff ``lo[N-1] <= hi[0]``. O(1)."""
    return bool(lo[-1] <= hi[0])
