"""Influence profiles ``(P_H ... P_1)[i, j]``, ``P = alpha I + (1 - alpha) Â``, ``Â[i, j] = M[i, j] r^|i-j| / Z_i``
(docs/masks.md, "Influence profiles"). For monotone interval masks, with ``u = v / Z`` and the reverse
intervals ``[lo'_j, hi'_j]``, one product is two range sums per key (:class:`RangeSums`, O(N)):

    (v Â)[j] = sum_{i=j}^{hi'_j} u_i r^(i-j) + r sum_{i=lo'_j}^{j-1} u_i r^(j-1-i);

any other mask uses its weighted CSR.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from .._figure import colour, new_axes
from ..errors import MaskError
from .._memory import check_memory, influence_bytes
from .._validate import check_float, check_int
from . import interval_graph
from .mask import Mask
from .range_sums import RangeSums
from .schedule import MaskSchedule, parse_schedule

#: The largest N for which ``query="all"`` forms the dense N x N influence matrix.
MAX_ALL_TOKENS = 1024
QUERIES = ("last", "all")


@dataclass
class Influence:
    """Influence of every input position on the last query (and optionally every query).

    ``profiles`` float64 ``(H, N)``, row ``h - 1`` = ``(P_h ... P_1)[N-1, :]``; ``matrix`` float64
    ``(N, N)`` ``P_H ... P_1`` with ``query="all"``; ``alpha`` a float or the per-layer weights;
    ``method`` ``"intervals"`` or ``"csr"``; ``summary`` (:func:`summarize`) and ``per_depth``.
    """

    spec: str
    n_tokens: int
    depth: int
    alpha: float | list[float]
    decay: float
    epsilon: float
    profiles: np.ndarray
    method: str
    matrix: np.ndarray | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    per_depth: list[dict[str, Any]] = field(default_factory=list)

    @property
    def influence(self) -> np.ndarray:
        """float64 ``(N,)``: influence of each input on the last query after ``depth`` layers."""
        return self.profiles[-1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"influence": [N], "summary": {...}, "per_depth": [...], ...}`` (and ``matrix``)."""
        out: dict[str, Any] = {"spec": self.spec, "n_tokens": self.n_tokens, "depth": self.depth, "alpha": self.alpha,
                               "decay": self.decay, "epsilon": self.epsilon, "method": self.method,
                               "influence": self.influence.tolist(), "summary": self.summary,
                               "per_depth": self.per_depth}
        if self.matrix is not None:
            out["matrix"] = self.matrix.tolist()
        return out


class _IntervalOperator:
    """``v -> v Â`` for a monotone interval mask (module docstring), O(N) per product."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, decay: float) -> None:
        n = lo.shape[0]
        decay = min(decay, _DECAY_ZERO)
        self.r = math.exp(-decay)
        keys = np.arange(n)
        if decay == 0.0:
            self.z = np.subtract(hi, lo, dtype=np.float64)
            self.z += 1.0
        else:
            left, right = keys - lo + 1, hi - keys + 1  # keys on each side, self counted twice
            self.z = _geometric(left, decay) + _geometric(right, decay) - 1.0
        self.left = None
        if self.r == 1.0 and lo[-1] == 0 and (hi == keys).all():  # causal: key j has the queries j..N-1
            self.right = RangeSums(n, None, None)
            return
        lo_rev, hi_rev = interval_graph.reverse(lo, hi)
        if self.r == 1.0:  # no decay: one range sum over all the queries of key j
            self.right = RangeSums(n, lo_rev, hi_rev)
            return
        self.right = RangeSums(n, keys, hi_rev, self.r)  # queries i >= j, left-anchored at j
        if (lo_rev < keys).any():  # queries i < j, right-anchored at j - 1: reversed ranges [n - j, n - 1 - lo'_j]
            self.left = RangeSums(n, n - keys, n - 1 - lo_rev, self.r)

    def __call__(self, v: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``v Â``, into ``out`` if given (else possibly a view of the plan's storage)."""
        out = self.right(v, self.z, out)  # sums of u = v / Z
        if self.left is not None:
            out += self.r * self.left(v[::-1], self.z[::-1])
        return out


#: Above this slope every weight ``exp(-m d)``, ``d >= 1``, is 0 in float64: a larger ``m`` is
#: computed as this one (same weights, no overflow of ``m d``).
_DECAY_ZERO = 800.0


def _geometric(count: np.ndarray, decay: float) -> np.ndarray:
    """``sum_{d=0}^{count-1} exp(-decay d)``, accurately."""
    count = count.astype(np.float64)
    if decay == 0.0:
        return count
    return np.expm1(-decay * count) / math.expm1(-decay)


class _CsrOperator:
    """``v -> v Â`` for any mask: the weighted, row-normalised CSR (O(E) memory)."""

    def __init__(self, mask: Mask, decay: float) -> None:
        csr = mask.to_csr()
        decay = min(decay, _DECAY_ZERO)
        rows = np.repeat(np.arange(mask.n_tokens), np.diff(csr.indptr))
        w = np.exp(-decay * np.abs(rows - csr.indices)) if decay else np.ones(csr.nnz)
        z = np.bincount(rows, weights=w, minlength=mask.n_tokens)
        w /= z[rows]
        # v Â = Â^T v: the transpose as CSR makes it one row-parallel sparse product
        self.transposed = sp.csr_array((w, csr.indices, csr.indptr), shape=csr.shape).T.tocsr()

    def __call__(self, v: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return self.transposed @ v
        out[...] = self.transposed @ v
        return out

    def dense(self) -> np.ndarray:
        return self.transposed.T.toarray()


def _operator(mask: Mask, decay: float, on_intervals: bool | None = None) -> Any:
    if _on_intervals(mask) if on_intervals is None else on_intervals:
        return _IntervalOperator(*mask.intervals, decay)
    return _CsrOperator(mask, decay)


def influence(mask: Any, n_tokens: int | None = None, *, depth: int, alpha: float, decay: float = 0.0,
              query: str = "last", epsilon: float = 0.01, max_memory: int | str | None = None) -> Influence:
    """Influence profile of a mask or schedule under uniform (or decayed) attention.

    Parameters
    ----------
    mask, n_tokens : a mask or schedule (spec, :class:`Mask`, :class:`MaskSchedule`) on N tokens.
    depth : layers H (>= 1).
    alpha : residual weight in ``[0, 1]``, or ``depth`` weights, one per layer (layer 0 first).
    decay : ALiBi-style slope ``m >= 0``: key ``j`` of query ``i`` weighted ``exp(-m |i-j|)``.
    query : ``"last"`` or ``"all"`` (also the ``N x N`` matrix, ``N <= MAX_ALL_TOKENS``).
    epsilon : mass left out of the effective horizon, in ``(0, 1)``.
    max_memory : bytes (or ``"8GiB"``) the computation may use (default half the RAM),
        checked (:func:`rankcollapse._memory.influence_bytes`) before the mask is parsed and
        again with its edge count: :class:`MemoryLimitError` beyond it.

    Raises :class:`MaskError` for a bad spec, N, depth, alpha, decay, epsilon or query,
    ``query="all"`` above ``MAX_ALL_TOKENS``, or N differing from a given Mask's.
    """
    if n_tokens is None:
        if not isinstance(mask, (Mask, MaskSchedule)):
            raise MaskError("n_tokens is needed for a mask spec")
        n_tokens = mask.n_tokens
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    depth = check_int(depth, "depth", low=1, error=MaskError)
    _check_size(n, depth, query, max_memory)  # before the per-layer weights or the mask exist
    alphas = _check_alphas(alpha, depth)
    decay, epsilon = _check_params(decay, epsilon, query, n)
    schedule = parse_schedule(mask, n)
    on_intervals = [_on_intervals(m) for m in schedule.masks]
    _check_size(n, depth, query, max_memory, schedule, on_intervals)
    ops = [_operator(m, decay, on) for m, on in zip(schedule.masks, on_intervals)]
    layer_ops = [ops[t % schedule.period] for t in range(depth)]
    summaries: list[dict[str, Any]] = []
    profiles = _profiles(layer_ops, n, alphas, periodic=schedule.period == 1 and len(set(alphas)) == 1,
                         each=lambda row: summaries.append(summarize(row, epsilon)))
    matrix = _matrix(schedule, n, alphas, decay) if query == "all" else None
    method = "intervals" if all(isinstance(o, _IntervalOperator) for o in ops) else "csr"
    per_depth = [row | {"depth": h + 1} for h, row in enumerate(summaries)]
    return Influence(spec=schedule.spec if schedule.period > 1 else schedule.masks[0].spec,
                     n_tokens=n, depth=depth, alpha=alphas[0] if len(set(alphas)) == 1 else alphas, decay=decay, epsilon=epsilon,
                     profiles=profiles, method=method, matrix=matrix,
                     summary=summaries[-1], per_depth=per_depth)


def _check_size(n: int, depth: int, query: str, max_memory: Any, schedule: MaskSchedule | None = None,
                on_intervals: list[bool] | None = None) -> None:
    """Refuse a computation whose :func:`~rankcollapse._memory.influence_bytes` exceed ``max_memory``."""
    edges, masks = 0, 1
    if schedule is not None:
        masks = len(schedule.masks)
        edges = sum(m.n_edges for m, on in zip(schedule.masks, on_intervals) if not on)
    need = influence_bytes(n, depth, n_edges=edges, n_masks=masks, query_all=query == "all")
    check_memory(need, f"the influence profile at N = {n}, depth {depth}" + (" (query all)" if query == "all" else ""),
                 max_memory)


def _on_intervals(mask: Mask) -> bool:
    iv = mask.intervals
    return iv is not None and interval_graph.is_monotone_interval(*iv)


def _check_alphas(alpha: Any, depth: int) -> list[float]:
    """One residual weight per layer, each in ``[0, 1]``."""
    if isinstance(alpha, (list, tuple, np.ndarray)):
        alphas = [check_float(a, "alpha", error=MaskError) for a in alpha]
        if len(alphas) != depth:
            raise MaskError(f"alpha holds {len(alphas)} per-layer weights but depth is {depth}")
    else:
        alphas = [check_float(alpha, "alpha", error=MaskError)] * depth
    bad = [a for a in alphas if not 0.0 <= a <= 1.0]
    if bad:
        raise MaskError(f"alpha (residual weight) must be in [0, 1], got {bad[0]}")
    return alphas


def _check_params(decay: Any, epsilon: Any, query: str, n: int) -> tuple[float, float]:
    decay, epsilon = check_float(decay, "decay", error=MaskError), check_float(epsilon, "epsilon", error=MaskError)
    if decay < 0.0:
        raise MaskError(f"decay m must be >= 0 (weights exp(-m |i-j|)), got {decay}")
    if not 0.0 < epsilon < 1.0:
        raise MaskError(f"epsilon must be in (0, 1), got {epsilon}")
    if query not in QUERIES:
        raise MaskError(f"query must be one of {', '.join(QUERIES)}, got {query!r}")
    if query == "all" and n > MAX_ALL_TOKENS:
        raise MaskError(f"query 'all' forms the dense N x N matrix, at most N = {MAX_ALL_TOKENS}; got N = {n} "
                        "(use query 'last')")
    return decay, epsilon


def _profiles(layer_ops: list, n: int, alphas: list[float], *, periodic: bool, each: Any = None) -> np.ndarray:
    """``(H, N)``: row ``h-1`` = ``e_last P_h ... P_1`` (``periodic``: one chain ``P^h``, else
    each depth its own chain from ``P_h`` down); ``each(row)`` is called on each row once made."""
    depth = len(layer_ops)
    out = np.empty((depth, n))
    start = np.zeros(n)
    start[-1] = 1.0
    def step(t: int, v: np.ndarray, into: np.ndarray) -> np.ndarray:
        """``v P_{t+1}`` into ``into``."""
        a = alphas[t]
        if a == 1.0:
            into[...] = v
            return into
        if a == 0.0:
            return layer_ops[t](v, into)
        mixed = layer_ops[t](v)
        np.multiply(v, a, out=into)  # a v + (1 - a) mixed: the same sum as (1 - a) mixed + a v
        mixed *= 1.0 - a
        into += mixed
        return into

    if periodic:
        v = start
        for h in range(depth):
            v = step(h, v, out[h])
            if each is not None:
                each(v)
        return out
    work = np.empty((2, n))
    for h in range(depth):
        v = start
        for t in range(h, -1, -1):  # e_last P_{h+1} first, P_1 last
            v = step(t, v, out[h] if t == 0 else work[t % 2])
        if each is not None:
            each(v)
    return out


def _matrix(schedule: MaskSchedule, n: int, alphas: list[float], decay: float) -> np.ndarray:
    """Dense ``P_H ... P_1`` (``N <= MAX_ALL_TOKENS``) from each layer's weighted CSR."""
    dense = [_CsrOperator(m, decay).dense() for m in schedule.masks]
    prod = np.eye(n)
    for t, a in enumerate(alphas):
        prod = (a * np.eye(n) + (1.0 - a) * dense[t % schedule.period]) @ prod
    return prod


def summarize(profile: np.ndarray, epsilon: float = 0.01) -> dict[str, Any]:
    """Summary statistics of one influence profile (float64 ``(N,)``): docs/masks.md, "Influence profiles"."""
    n = profile.shape[0]
    total = float(profile.sum())
    tiny = np.finfo(np.float64).tiny
    n_support, valley = n, int(np.argmin(profile))  # the first minimum over the support
    if profile[valley] < tiny:
        in_support = profile >= tiny
        n_support = int(np.count_nonzero(in_support))
        valley = int(np.argmin(np.where(in_support, profile, np.inf))) if n_support else None
    return {"first_token_mass": float(profile[0]), "last_token_mass": float(profile[-1]), "valley_position": valley,
            "valley_mass": None if valley is None else float(profile[valley]),
            "valley_ratio": None if valley is None else float(profile[valley] * n_support),
            "effective_horizon": _horizon(profile, (1.0 - epsilon) * total), "n_support": n_support, "mass": total}


def _horizon(profile: np.ndarray, mass: float) -> int:
    """The fewest most recent positions whose sequential running sum from the end reaches
    ``mass`` (all ``N`` if none does): block totals locate the crossing when it clears their error
    bounds, else the sequential sum is formed in chunks from the end."""
    recent, n = profile[::-1], profile.shape[0]
    size = 1024
    if n > 4 * size and 0.0 < mass < math.inf:
        margin = 2.0 * (n + 2 * size + n // size + 64) * np.finfo(np.float64).eps
        full = n // size * size
        totals = recent[:full].reshape(-1, size).sum(axis=1)
        if full < n:
            totals = np.append(totals, recent[full:].sum())
        ends = np.cumsum(totals)
        c = int(np.searchsorted(ends, mass * (1.0 - margin), side="left"))
        if c < ends.shape[0]:
            before = float(ends[c - 1]) if c else 0.0
            run = np.cumsum(recent[c * size:(c + 1) * size])
            if c:
                run += before
            k = int(np.searchsorted(run, mass, side="left"))
            if k < run.shape[0]:
                below = run[k - 1] if k else (before if c else -math.inf)
                if run[k] >= mass * (1.0 + margin) and below < mass * (1.0 - margin):
                    return c * size + k + 1
    start, size, carry = 0, 4096, None
    while start < n:
        part = recent[start:start + size]
        sums = np.cumsum(part) if carry is None else np.cumsum(np.concatenate(([carry], part)))[1:]
        k = int(np.searchsorted(sums, mass, side="left"))
        if k < sums.shape[0]:
            return start + k + 1
        start, size, carry = start + sums.shape[0], 2 * size, sums[-1]
    return n


def draw_influence(result: Influence, *, ax: Any = None, max_points: int = 4096) -> Any:
    """Influence vs input position, one curve per depth (log scale, subnormal entries left
    out, at most ``max_points`` positions); returns the figure, drawn on ``ax`` if given.
    Raises :class:`MaskError` when ``result`` is not an :class:`Influence`."""
    if not isinstance(result, Influence):
        raise MaskError(f"draw_influence draws the Influence that influence() returns, got {type(result).__name__}")
    fig, ax = new_axes(ax, figsize=(7.0, 4.2))
    n, depth = result.n_tokens, result.depth
    pos = np.unique(np.linspace(0, n - 1, min(n, max_points)).round().astype(np.int64))
    shown = shown_depths(depth)
    for k, h in enumerate(shown):
        y = result.profiles[h - 1][pos]
        keep = y >= np.finfo(np.float64).tiny
        ax.plot(pos[keep], y[keep], color=colour(k, "viridis" if len(shown) > 10 else "tab10"),
                lw=1.2, label=f"depth {h}")
    ax.set(yscale="log", xlabel="input position j", ylabel="influence on the last query  (P_H ... P_1)[N-1, j]")
    alpha = f"{result.alpha:g}" if isinstance(result.alpha, float) else "per layer"
    ax.set_title(f"{result.spec}, N = {n}, alpha = {alpha}, decay = {result.decay:g}", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


def ranks_something(profile: np.ndarray) -> bool:
    """Whether ``profile`` (float ``(N,)``) has at least three distinct values to 9 significant
    digits (relative to its maximum); with fewer, a rank correlation would rank round-off."""
    profile = np.asarray(profile, dtype=np.float64)
    scaled = profile / profile.max() if profile.max() > 0 else profile
    return np.unique(np.round(scaled, 9)).size >= 3


def shown_depths(depth: int) -> list[int]:
    """The depths a figure draws: 1, ``depth`` and about six evenly spaced between."""
    return sorted({1, depth, *range(1, depth + 1, max(1, depth // 6))})


def window_horizon(width: int, depth: int, alpha: float, epsilon: float = 0.01) -> float:
    """Normal approximation of the effective horizon of ``causal_sliding_window:w=width`` under
    uniform attention with residual ``alpha`` after ``depth`` layers (docs/masks.md, "Horizon of a
    causal window"): with the step ``S = B U``, ``B ~ Bernoulli(1 - alpha)``, ``U ~ Uniform{0, ..., W-1}``,

        E S = (1 - alpha)(W - 1)/2,   Var S = (1 - alpha)(W^2 - 1)/12 + alpha (1 - alpha)(W - 1)^2/4,

    ``horizon ~ ceil(H E S + z sqrt(H Var S) + 1/2)``, ``z = Phi^{-1}(1 - epsilon)``, capped by
    ``H (W - 1) + 1`` (a float; while no path reaches token 0). Raises :class:`MaskError` for a bad
    width, depth, alpha or epsilon.
    """
    from scipy.stats import norm

    w = check_int(width, "width", low=1, error=MaskError)
    h = check_int(depth, "depth", low=1, error=MaskError)
    (a,) = _check_alphas(alpha, 1)
    _check_params(0.0, epsilon, "last", 1)
    mean = (1.0 - a) * (w - 1) / 2.0
    var = (1.0 - a) * (w * w - 1) / 12.0 + a * (1.0 - a) * (w - 1) ** 2 / 4.0
    z = float(norm.ppf(1.0 - float(epsilon)))
    return float(min(math.ceil(h * mean + z * math.sqrt(h * var) + 0.5), h * (w - 1) + 1))
