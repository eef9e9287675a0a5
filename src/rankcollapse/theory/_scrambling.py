"""The search for a schedule's scrambling length ``L`` (docs/theory.md §7;
:func:`~.envelope.scrambling_length`): ``L = max_s L(s)`` over the phases, each the least window
length with a full column (at most ``p (r_H + 1) - 1``), composed as intervals or as sparse products
restricted to the candidate roots (the centers of the union of the layer graphs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .._memory import check_memory
from ..masks import Mask, analyze, interval_graph


def _interval_window(layers: list[tuple[np.ndarray, np.ndarray]], start: int, cap: int) -> int | None:
    p = len(layers)
    prod = layers[start % p]
    for length in range(1, cap + 1):
        if interval_graph.has_full_column(*prod):
            return length
        prod = interval_graph.compose(layers[(start + length) % p], prod)
    return None


def _rooted(columns: sp.csr_array, n: int) -> bool:
    """Whether one of the columns of a boolean product is all True."""
    return bool(columns.nnz) and int(np.bincount(columns.indices, minlength=columns.shape[1]).max()) == n


def _sparse_window(layers: list[sp.csr_array], candidates: np.ndarray, start: int, cap: int) -> int | None:
    p, n = len(layers), layers[0].shape[0]
    prod = layers[start % p][:, candidates]
    for length in range(1, cap + 1):
        if _rooted(prod, n):
            return length
        prod = layers[(start + length) % p] @ prod  # bool @ bool: scipy's boolean product
    return None


def scrambling_search(schedule: Any, radius: int, *, max_memory: int | str | None = None) -> int | None:
    """``L`` of a :class:`~rankcollapse.masks.MaskSchedule` with self-loops whose composed graph
    is QSC with radius ``radius``; None if some phase has no rooted window within the cap.
    Raises :class:`MemoryLimitError` when the sparse products would exceed ``max_memory``."""
    p, n = schedule.period, schedule.n_tokens
    cap = p * (radius + 1) - 1
    intervals = schedule.intervals()
    if intervals is not None:
        windows = (_interval_window(intervals, s, cap) for s in range(p))
    else:
        layers = [sp.csr_array(m.to_csr(), dtype=bool) for m in schedule.masks]
        union = sum(layers[1:], start=layers[0])  # bool + bool: logical or
        # the candidate roots: the centers of the union (none when it is not QSC)
        centers = analyze(Mask(n, "union", csr=union), max_memory=max_memory).centers
        candidates = np.asarray(centers, dtype=np.int64)
        check_memory(9.0 * n * len(candidates), f"the scrambling-length search of {schedule.spec!r} at N = {n}",
                     max_memory)
        windows = (_sparse_window(layers, candidates, s, cap) for s in range(p))
    best = 0
    for length in windows:
        if length is None:
            return None
        best = max(best, length)
    return best
