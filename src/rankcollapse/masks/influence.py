"""Influence profiles of masks and schedules: which input positions a token depends on.

Model (docs/masks.md, "Influence profiles"). Under uniform attention over each row's
allowed keys, optionally weighted by an ALiBi-style decay ``exp(-m |i - j|)`` (Press et al.
2022), the attention matrix of a layer with mask ``M`` is the row-normalised

    Â[i, j] = M[i, j] r^|i-j| / Z_i,   r = exp(-m),   Z_i = sum_j M[i, j] r^|i-j|,

and with residual mixing one layer is ``P = alpha I + (1 - alpha) Â`` (per layer for a
schedule: layer ``t`` uses ``schedule.layer(t)``, layer 0 first). The influence of input
``j`` on query ``i`` after ``H`` layers is ``(P_H ... P_1)[i, j]`` (Wu et al., ICML 2025,
"On the Emergence of Position Bias in Transformers", §3; attention rollout, Abnar &
Zuidema 2020, is the same product with the model's own maps). Every ``P`` is
row-stochastic, so each row of the product is a probability vector over inputs.

Closed forms used by the tests:

* **Causal, alpha = 0.** ``Â = C``, the Cesàro matrix ``C[i, j] = 1/(i+1)`` for ``j <= i``;
  the influence after ``H`` layers is ``C^H``; its first row sums are ``C^H[i, 0]``.
* **Self term.** ``P`` is lower triangular for the causal mask, so ``P^H`` is too and its
  diagonal is the ``H``-th power of ``P``'s: ``(P^H)[i, i] = (alpha + (1-alpha)/(i+1))^H``;
  the last query's self mass is ``(alpha + (1-alpha)/N)^H``. With the decay the diagonal
  is ``(alpha + (1-alpha)/Z_i)^H``, ``Z_i = (1 - r^(i+1)) / (1 - r)``.

Computation. The last query's profile is the row vector ``e_last P_H ... P_1``, built left
to right with one vector-matrix product per layer; the per-depth profiles (depths 1..H)
come from the same products (for a schedule, depth ``h`` is ``e_last P_h ... P_1``, so
the chains differ and ``H (H+1) / 2`` products are made). Two exact paths:

* **Monotone interval masks** (complete, causal, sliding and causal sliding windows,
  prefix, blocks, documents; and schedules of them): by
  :func:`~rankcollapse.masks.interval_graph.reverse`, the queries attending key ``j`` are
  a range ``[lo'_j, hi'_j]``, so with ``u = v / Z``

      (v Â)[j] = sum_{i=j}^{hi'_j} u_i r^(i-j) + r sum_{i=lo'_j}^{j-1} u_i r^(j-1-i),

  two geometric range sums of a non-negative vector per key. They are evaluated on a
  segment tree (:func:`range_sums`) in O(N log N) per layer and O(N) memory, adding only
  non-negative terms: every entry keeps float64 relative accuracy (~ H log2 N eps),
  tails of 1e-60 included. (A difference of prefix sums is O(N) but has absolute error
  ~eps of the total mass, which drowns a window's far tail: after 12 layers of
  ``sliding_window:w=257`` the last entries are ~1e-30.) The causal mask's ``N^2/2``
  edges are never formed.
* **Any other mask**: the weighted, row-normalised CSR (O(E) memory), one sparse
  product per layer.

``query="all"`` returns the dense ``N x N`` product for ``N <=`` :data:`MAX_ALL_TOKENS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import MaskError
from .._memory import check_memory, influence_bytes
from .._validate import check_int
from . import interval_graph
from .mask import Mask
from .schedule import MaskSchedule, parse_schedule

#: The largest N for which ``query="all"`` forms the dense N x N influence matrix.
MAX_ALL_TOKENS = 1024
QUERIES = ("last", "all")


@dataclass
class Influence:
    """Influence of every input position on the last query (and optionally every query).

    Attributes
    ----------
    spec : the mask or schedule spec.
    n_tokens, depth, alpha, decay : the model's ``N``, ``H``, ``alpha`` (a float, or the
        list of per-layer weights when they differ), ``m``.
    profiles : float64 ``(H, N)``; row ``h - 1`` is ``(P_h ... P_1)[N-1, :]``.
    matrix : float64 ``(N, N)`` ``P_H ... P_1`` with ``query="all"``, else None.
    method : ``"intervals"`` or ``"csr"`` (how ``v Â`` was applied).
    summary : :func:`summarize` of the last profile; ``per_depth`` of each profile.
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
        """``{"influence": [N], "summary": {...}, "per_depth": [...], ...}`` (and ``matrix``
        with ``query="all"``), JSON-ready lists."""
        out: dict[str, Any] = {
            "spec": self.spec, "n_tokens": self.n_tokens, "depth": self.depth, "alpha": self.alpha,
            "decay": self.decay, "epsilon": self.epsilon, "method": self.method,
            "influence": self.influence.tolist(), "summary": self.summary, "per_depth": self.per_depth,
        }
        if self.matrix is not None:
            out["matrix"] = self.matrix.tolist()
        return out


# ------------------------------------------------------------------ range sums
def range_sums(x: np.ndarray, a: np.ndarray, b: np.ndarray, r: float = 1.0) -> np.ndarray:
    """``out[k] = sum_{i=a[k]}^{b[k]} x[i] r^(i - a[k])`` (0 where ``a[k] > b[k]``).

    ``x``: float64 ``(N,)`` non-negative; ``a``, ``b``: int ``(K,)`` in ``[0, N)``;
    ``0 <= r <= 1`` (``r = 0``, a decay past float64's range, weights only ``i = a[k]``). A bottom-up segment tree whose node holds its left-anchored weighted
    sum; each range is the union of at most two nodes per level, visited left to right,
    each added with the factor ``r^(start - a)``. Only non-negative terms are added, so
    the result has relative error ~ ``log2(N) eps`` (no cancellation). O((N + K) log N).
    """
    n = x.shape[0]
    size = 1 << max(1, (n - 1).bit_length())
    levels = size.bit_length() - 1
    tree = [np.zeros(size)]  # tree[k]: level k, node length 2^k
    tree[0][:n] = x
    for k in range(levels):
        child = tree[k].reshape(-1, 2)
        tree.append(child[:, 0] + (r ** (1 << k)) * child[:, 1] if r != 1.0 else child.sum(1))
    out = np.zeros(a.shape[0])
    a = np.asarray(a, dtype=np.int64)
    lo = a.copy()
    hi = np.asarray(b, dtype=np.int64) + 1  # half-open [lo, hi) in units of nodes
    log_r = math.log(r) if r > 0.0 else -math.inf  # exp(-m) underflows to 0 for m > ~745
    for k in range(levels + 1):
        live = lo < hi
        if not live.any():
            break
        take = live & (lo & 1).astype(bool)  # a left-boundary node at this level
        if take.any():
            idx = lo[take]
            out[take] += tree[k][idx] * _power(log_r, (idx << k) - a[take])
            lo[take] += 1
        take = (lo < hi) & (hi & 1).astype(bool)  # a right-boundary node
        if take.any():
            hi[take] -= 1
            idx = hi[take]
            out[take] += tree[k][idx] * _power(log_r, (idx << k) - a[take])
        lo >>= 1
        hi >>= 1
    return out


def _power(log_r: float, exponent: np.ndarray) -> np.ndarray:
    """``r^exponent`` (exactly 1 when ``r = 1``; ``0^0 = 1`` when ``r = 0``)."""
    if log_r == 0.0:
        return np.ones(exponent.shape[0])
    if log_r == -math.inf:
        return (exponent == 0).astype(np.float64)
    return np.exp(log_r * exponent)


# --------------------------------------------------------------- operators
class _IntervalOperator:
    """``v -> v Â`` for a monotone interval mask (module docstring), O(N log N)."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, decay: float) -> None:
        n = lo.shape[0]
        decay = min(decay, _DECAY_ZERO)
        self.r = math.exp(-decay)
        left, right = np.arange(n) - lo + 1, hi - np.arange(n) + 1  # keys on each side, self counted twice
        self.z = _geometric(left, decay) + _geometric(right, decay) - 1.0
        self.lo_rev, self.hi_rev = interval_graph.reverse(lo, hi)
        self.keys = np.arange(n)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        u = v / self.z
        out = range_sums(u, self.keys, self.hi_rev, self.r)  # queries i >= j
        # queries i < j, right-anchored at j - 1: reverse the vector and the ranges
        n = u.shape[0]
        a, b = n - self.keys, n - 1 - self.lo_rev  # positions of j-1 .. lo' in reversed u
        has = self.lo_rev < self.keys
        if has.any():
            out[has] += self.r * range_sums(u[::-1].copy(), a[has], b[has], self.r)
        return out


#: Above this slope every weight ``exp(-m d)`` with ``d >= 1`` is 0 in float64 (the smallest
#: subnormal is ``exp(-744.4)``): a larger ``m`` is computed as this one, with the same
#: weights and without overflowing ``m d``.
_DECAY_ZERO = 800.0


def _geometric(count: np.ndarray, decay: float) -> np.ndarray:
    """``sum_{d=0}^{count-1} exp(-decay d)`` (``count`` when ``decay = 0``), accurately."""
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

    def __call__(self, v: np.ndarray) -> np.ndarray:
        return self.transposed @ v

    def dense(self) -> np.ndarray:
        return self.transposed.T.toarray()


def _operator(mask: Mask, decay: float) -> Any:
    if _on_intervals(mask):
        return _IntervalOperator(*mask.intervals, decay)
    return _CsrOperator(mask, decay)


# ------------------------------------------------------------------ public
def influence(
    mask: Any,
    n_tokens: int | None = None,
    *,
    depth: int,
    alpha: float,
    decay: float = 0.0,
    query: str = "last",
    epsilon: float = 0.01,
    max_memory: int | str | None = None,
) -> Influence:
    """Influence profile of a mask or schedule under uniform (or decayed) attention.

    Parameters
    ----------
    mask : mask or schedule spec (``"causal"``, ``"schedule:sliding_window:w=9*5,complete"``),
        :class:`Mask` or :class:`MaskSchedule`.
    n_tokens : N (>= 1); may be omitted for a Mask or MaskSchedule (theirs is used).
    depth : layers H (>= 1).
    alpha : residual weight in ``[0, 1]``: ``P = alpha I + (1 - alpha) Â``; or a sequence of
        ``depth`` weights, one per layer (layer 0 first), e.g. fitted to a model.
    decay : ALiBi-style slope ``m >= 0``: key ``j`` of query ``i`` weighted ``exp(-m |i-j|)``.
    query : ``"last"`` (profiles of the last query) or ``"all"`` (also the ``N x N`` matrix,
        ``N <= MAX_ALL_TOKENS``).
    epsilon : mass left out of the effective horizon, in ``(0, 1)``.
    max_memory : bytes (or ``"8GiB"``) the computation may use (default half the RAM):
        estimated (:func:`rankcollapse._memory.influence_bytes`) from N and H before the
        mask is parsed, and again with its edge count before any product.

    Returns
    -------
    Influence
        ``profiles`` float64 ``(H, N)``, ``summary`` (:func:`summarize`), ``matrix`` with
        ``query="all"``. Formulas and sources: module docstring.

    Raises
    ------
    MaskError
        Bad spec, N, depth, alpha, decay, epsilon or query; ``query="all"`` above
        ``MAX_ALL_TOKENS``; N differing from a given Mask's.
    MemoryLimitError
        The estimated memory exceeds ``max_memory`` (one line with the estimate).
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
    _check_size(n, depth, query, max_memory, schedule)
    ops = [_operator(m, decay) for m in schedule.masks]
    layer_ops = [ops[t % schedule.period] for t in range(depth)]
    profiles = _profiles(layer_ops, n, alphas, periodic=schedule.period == 1 and len(set(alphas)) == 1)
    matrix = _matrix(schedule, n, alphas, decay) if query == "all" else None
    method = "intervals" if all(isinstance(o, _IntervalOperator) for o in ops) else "csr"
    per_depth = [summarize(p, epsilon) | {"depth": h + 1} for h, p in enumerate(profiles)]
    return Influence(spec=schedule.spec if schedule.period > 1 else schedule.masks[0].spec,
                     n_tokens=n, depth=depth, alpha=alphas[0] if len(set(alphas)) == 1 else alphas, decay=decay, epsilon=epsilon,
                     profiles=profiles, method=method, matrix=matrix,
                     summary=summarize(profiles[-1], epsilon), per_depth=per_depth)


def _check_size(n: int, depth: int, query: str, max_memory: Any, schedule: MaskSchedule | None = None) -> None:
    """Refuse a computation whose :func:`~rankcollapse._memory.influence_bytes` exceeds
    ``max_memory``: from N and H alone, then with the schedule's masks (the CSR edges of
    those not on the interval path, the dense matrices of ``query="all"``)."""
    edges, masks = 0, 1
    if schedule is not None:
        masks = len(schedule.masks)
        edges = sum(m.n_edges for m in schedule.masks if not _on_intervals(m))
    need = influence_bytes(n, depth, n_edges=edges, n_masks=masks, query_all=query == "all")
    check_memory(need, f"the influence profile at N = {n}, depth {depth}" + (" (query all)" if query == "all" else ""),
                 max_memory)


def _on_intervals(mask: Mask) -> bool:
    iv = mask.intervals
    return iv is not None and interval_graph.is_monotone_interval(*iv)


def _num(x: Any, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)) or not math.isfinite(x):
        raise MaskError(f"{name} must be a finite number, got {x!r}")
    return float(x)


def _check_alphas(alpha: Any, depth: int) -> list[float]:
    """One residual weight per layer, each in ``[0, 1]``."""
    if isinstance(alpha, (list, tuple, np.ndarray)):
        alphas = [_num(a, "alpha") for a in alpha]
        if len(alphas) != depth:
            raise MaskError(f"alpha holds {len(alphas)} per-layer weights but depth is {depth}")
    else:
        alphas = [_num(alpha, "alpha")] * depth
    bad = [a for a in alphas if not 0.0 <= a <= 1.0]
    if bad:
        raise MaskError(f"alpha (residual weight) must be in [0, 1], got {bad[0]}")
    return alphas


def _check_params(decay: Any, epsilon: Any, query: str, n: int) -> tuple[float, float]:
    decay, epsilon = _num(decay, "decay"), _num(epsilon, "epsilon")
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


def _profiles(layer_ops: list, n: int, alphas: list[float], *, periodic: bool) -> np.ndarray:
    """``(H, N)``: row ``h-1`` = ``e_last P_h ... P_1``. One mask: one chain of H products
    (``P_h ... P_1 = P^h``); a schedule: each depth its own chain, applied from ``P_h`` down."""
    depth = len(layer_ops)
    out = np.empty((depth, n))
    start = np.zeros(n)
    start[-1] = 1.0
    def step(t: int, v: np.ndarray) -> np.ndarray:
        a = alphas[t]
        return v if a == 1.0 else a * v + (1.0 - a) * layer_ops[t](v)

    if periodic:
        v = start
        for h in range(depth):
            v = step(h, v)
            out[h] = v
        return out
    for h in range(depth):
        v = start
        for t in range(h, -1, -1):  # e_last P_{h+1} first, P_1 last
            v = step(t, v)
        out[h] = v
    return out


def _matrix(schedule: MaskSchedule, n: int, alphas: list[float], decay: float) -> np.ndarray:
    """Dense ``P_H ... P_1`` (``N <= MAX_ALL_TOKENS``) from each layer's weighted CSR."""
    dense = [_CsrOperator(m, decay).dense() for m in schedule.masks]
    prod = np.eye(n)
    for t, a in enumerate(alphas):
        prod = (a * np.eye(n) + (1.0 - a) * dense[t % schedule.period]) @ prod
    return prod


def summarize(profile: np.ndarray, epsilon: float = 0.01) -> dict[str, Any]:
    """Summary statistics of one influence profile ``I`` (float64 ``(N,)``, sums to 1).

    * ``first_token_mass`` ``I[0]``; ``last_token_mass`` ``I[N-1]`` (the last query's self term);
    * ``valley_position`` ``argmin I[j]`` over the support ``{j : I[j] >= tiny}`` (first of
      ties; ``tiny`` = 2.2e-308, the smallest normal float64: below it values are
      subnormal and lose their relative accuracy, so they are never the valley),
      ``valley_mass`` its value, ``valley_ratio`` ``valley_mass * n_support`` (1 = the
      uniform share; the valley's depth);
    * ``effective_horizon`` the fewest most recent positions ``N-k .. N-1`` holding at
      least ``(1 - epsilon)`` of the mass; ``n_support`` positions in the support;
    * ``mass`` ``sum I`` (1 up to rounding).
    """
    n = profile.shape[0]
    total = float(profile.sum())
    support = np.flatnonzero(profile >= np.finfo(np.float64).tiny)
    valley = int(support[np.argmin(profile[support])]) if support.size else None
    recent = np.cumsum(profile[::-1])
    horizon = int(np.searchsorted(recent, (1.0 - epsilon) * total, side="left")) + 1
    return {
        "first_token_mass": float(profile[0]),
        "last_token_mass": float(profile[-1]),
        "valley_position": valley,
        "valley_mass": None if valley is None else float(profile[valley]),
        "valley_ratio": None if valley is None else float(profile[valley] * support.size),
        "effective_horizon": min(horizon, n),
        "n_support": int(support.size),
        "mass": total,
    }


def draw_influence(result: Influence, *, ax: Any = None, max_points: int = 4096) -> Any:
    """Influence vs input position, one curve per depth (log scale); returns the figure.

    ``ax``: a matplotlib axes to draw on (else a new pyplot-free figure). Entries below
    the smallest normal float64 are left out (log scale). Above ``max_points``
    positions, each curve is drawn at ``max_points`` evenly spaced positions (the last
    one included). Write it with :func:`rankcollapse._figure.save_figure`.

    Raises
    ------
    MaskError
        ``result`` is not an :class:`Influence` (as :func:`influence` returns).
    """
    from .._figure import colour, new_axes

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
    ax.set_yscale("log")
    ax.set_xlabel("input position j")
    ax.set_ylabel("influence on the last query  (P_H ... P_1)[N-1, j]")
    alpha = f"{result.alpha:g}" if isinstance(result.alpha, float) else "per layer"
    ax.set_title(f"{result.spec}, N = {n}, alpha = {alpha}, decay = {result.decay:g}", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


def ranks_something(profile: np.ndarray) -> bool:
    """Whether ``profile`` (float ``(N,)``) has at least three distinct values to 9
    significant digits (relative to its maximum). A profile with fewer ranks nothing: a
    rank correlation with it would rank the rounding noise of the other side among its
    tied positions (uniform attention's first layer under the causal mask; every layer
    under the complete mask but for the self term)."""
    profile = np.asarray(profile, dtype=np.float64)
    scaled = profile / profile.max() if profile.max() > 0 else profile
    return np.unique(np.round(scaled, 9)).size >= 3


def shown_depths(depth: int) -> list[int]:
    """The depths a figure draws one curve each for: 1, ``depth`` and about six evenly
    spaced between (at most ~8 curves)."""
    return sorted({1, depth, *range(1, depth + 1, max(1, depth // 6))})


def window_horizon(width: int, depth: int, alpha: float, epsilon: float = 0.01) -> float:
    """Normal (central-limit) approximation of the effective horizon of
    ``causal_sliding_window:w=width`` under uniform attention with residual ``alpha``
    after ``depth`` layers, on a sequence long enough that no path reaches token 0
    (``N - 1 >= depth (width - 1)``).

    Derivation (docs/masks.md, "Horizon of a causal window"). Row ``N-1`` of
    ``P_H ... P_1`` is the law of the position reached by walking back from ``N-1``:
    at each layer the walk stays with probability ``alpha`` and otherwise moves back by
    ``U ~ Uniform{0, ..., W-1}`` (uniform attention over the query and its ``W - 1``
    predecessors). So ``I[N-1-d] = P(D = d)``, ``D = S_1 + ... + S_H`` with i.i.d. steps
    ``S = B U``, ``B ~ Bernoulli(1 - alpha)``:

        E S = (1 - alpha)(W - 1)/2,   Var S = (1 - alpha)(W^2 - 1)/12 + alpha (1 - alpha)(W - 1)^2/4,

    and the effective horizon (the fewest recent positions holding ``1 - epsilon`` of the
    mass, :func:`summarize`) is ``q_{1-epsilon}(D) + 1``. With the continuity-corrected
    normal quantile, ``horizon ~ ceil(H E S + z sqrt(H Var S) + 1/2)``, ``z = Phi^{-1}(1 -
    epsilon)``, capped by the receptive field ``H (W - 1) + 1``. It grows with the depth
    (as ``H`` plus ``sqrt(H)``), unlike ``W ln(epsilon) / ln(1 - alpha)``, the horizon of a
    walk that stops for good with probability ``alpha`` at each step.

    Returns a float (a whole number of positions). Raises :class:`MaskError` for
    ``width < 1``, ``depth < 1``, ``alpha`` outside ``[0, 1]`` or ``epsilon`` outside ``(0, 1)``.
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
