"""Participation ratio ``PR = 1 / sum_j a_j^2`` of one attention row against the number of keys
N under each temperature law (:mod:`rankcollapse.dynamics.temperature_laws`), O(N d) per row:
for i.i.d. uniform keys on ``S^{d-1}`` it stays bounded when ``β`` grows like ``N^{2/(d-1)}``
(``pow:c``) and grows like ``N / β^{(d-1)/2}`` under slower laws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from .._memory import check_memory
from .._validate import check_int
from ..dynamics.inputs import canonical_input, make_tokens
from ..dynamics.temperature_laws import TemperatureLaw, parse_law
from ..errors import ConfigError
from ..metrics import mu_relative
from ..metrics.attention import row_participation

#: where the query comes from: a fresh draw of the key distribution, or key 0 itself
QUERIES = ("fresh", "key")
#: at most this many queries at once
CHUNK = 16
#: bytes of the token draws (``COPIES (b, N + 1, d)`` float64) of one chunk of queries
CHUNK_BYTES = 256 * 2**20
COPIES = 3
#: bootstrap resamples of the growth exponent's interval
N_BOOT = 2000


@dataclass
class TemperatureScan:
    """Result of :func:`participation_scan`: ``rows`` per ``(n_tokens, law)`` (``n_tokens, law, beta,
    pr_mean, pr_lo, pr_hi`` (95 % t-interval), ``pr_median, n_queries``), ``slopes`` per law (``law, slope,
    slope_lo, slope_hi``: 95 % bootstrap, NaN with one N), ``per_query[(N, law)]`` every query's PR."""

    rows: list[dict[str, Any]]
    slopes: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)
    per_query: dict[tuple[int, str], np.ndarray] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "slopes": self.slopes, "config": self.config}


def query_participation(keys: torch.Tensor, queries: torch.Tensor, beta: float) -> torch.Tensor:
    """``PR`` ``(B,)`` of the rows ``softmax_j(β <q_b, k_bj>)``, ``keys`` ``(B, N, d)``, ``queries``
    ``(B, d)``."""
    scores = beta * torch.einsum("bnd,bd->bn", keys, queries)  # (B, N)
    return row_participation(torch.softmax(scores, dim=-1))


def participation_scan(laws: Sequence[str | TemperatureLaw], n_tokens: Sequence[int], *, keys: str = "sphere",
                       d_model: int = 3, n_queries: int = 64, query: str = "fresh", seed: int = 0,
                       max_memory: int | str | None = None) -> TemperatureScan:
    """Mean participation ratio of one query over ``N`` keys per law (``"log:1"``, ``"pow:1"``,
    ``"ssmax:1"``, ``"llama4"`` or parsed) and ``N``: ``n_queries`` (>= 2) queries per ``N``, each
    drawing ``N + 1`` tokens of the input ``keys`` (:data:`rankcollapse.dynamics.inputs.INPUTS`);
    the query is token ``N`` (``query="fresh"``) or key 0 (``"key"``). The ``i``-th ``N`` is drawn
    with seed ``seed + i`` in chunks of at most :data:`CHUNK` queries; the bootstrap uses ``seed``.
    ``max_memory``: bytes (or ``"8GiB"``) one query's tokens may take; default half the RAM.

    Raises ConfigError for an unknown law, input or query kind, ``N < 2``, ``n_queries < 2``,
    ``d_model < 1``, ``pow`` with ``d_model < 2``, no law or no ``N``; MemoryLimitError when one
    query's tokens would exceed ``max_memory``.
    """
    parsed = [law if isinstance(law, TemperatureLaw) else parse_law(law) for law in laws]
    sizes = [check_int(n, "n_tokens", low=2) for n in n_tokens]
    if not parsed or not sizes:
        raise ConfigError("give at least one temperature law and one n_tokens")
    keys = canonical_input(keys)
    d_model = check_int(d_model, "d_model", low=1)
    n_queries = check_int(n_queries, "n_queries", low=2)
    seed = check_int(seed, "seed", low=0)
    if query not in QUERIES:
        raise ConfigError(f"query must be one of {', '.join(QUERIES)}, got {query!r}")
    for law in parsed:  # refuse before drawing
        law.beta(max(sizes), d_model)
    one = COPIES * (max(sizes) + 1) * d_model * 8  # bytes per query
    check_memory(one, f"drawing {max(sizes) + 1} tokens of width {d_model} for one query", max_memory)
    values = {}  # (N, spec) -> (n_queries,) PR
    for i, N in enumerate(sizes):
        gen = torch.Generator().manual_seed(seed + i)
        chunks: dict[str, list[torch.Tensor]] = {law.spec: [] for law in parsed}
        chunk = max(1, min(CHUNK, CHUNK_BYTES // (COPIES * (N + 1) * d_model * 8)))
        for start in range(0, n_queries, chunk):
            b = min(chunk, n_queries - start)
            X = make_tokens(keys, b, N + 1, d_model, generator=gen)  # (b, N + 1, d)
            K, q = (X[:, :N], X[:, N]) if query == "fresh" else (X[:, :N], X[:, 0])
            for law in parsed:
                chunks[law.spec].append(query_participation(K, q, law.beta(N, d_model)))
        for spec, parts in chunks.items():
            values[(N, spec)] = torch.cat(parts).numpy()
    rows = []
    for N in sizes:
        for law in parsed:
            v = values[(N, law.spec)]
            mean, half = float(v.mean()), _t_half(v)
            rows.append({"n_tokens": N, "law": law.spec, "beta": law.beta(N, d_model), "pr_mean": mean,
                         "pr_lo": mean - half, "pr_hi": mean + half, "pr_median": float(np.median(v)),
                         "n_queries": int(v.size)})
    rng = np.random.default_rng(seed)
    slopes = [{"law": law.spec, **_slope([values[(N, law.spec)] for N in sizes], sizes, rng)} for law in parsed]
    config = {"laws": [law.spec for law in parsed], "n_tokens": sizes, "keys": keys, "d_model": d_model,
              "n_queries": n_queries, "query": query, "seed": seed}  # max_memory changes no number
    return TemperatureScan(rows, slopes, config, values)


def _t_half(v: np.ndarray) -> float:
    """Half-width of the 95 % t-interval of the mean of ``v`` (``v.size >= 2``)."""
    from scipy import stats

    return float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))


def _slope(per_n: list[np.ndarray], sizes: list[int], rng: np.random.Generator) -> dict[str, float]:
    """Least-squares slope of ``ln mean PR`` on ``ln N`` and its 95 % bootstrap interval over
    queries; NaN with fewer than two distinct N."""
    x = np.log(np.asarray(sizes, dtype=np.float64))
    if np.unique(x).size < 2:
        nan = float("nan")
        return {"slope": nan, "slope_lo": nan, "slope_hi": nan}
    xc = x - x.mean()

    def fit(means: np.ndarray) -> np.ndarray:  # (..., len(sizes)) -> (...)
        return (np.log(means) - np.log(means).mean(-1, keepdims=True)) @ xc / (xc @ xc)

    point = float(fit(np.array([v.mean() for v in per_n])))
    boot = np.stack([v[rng.integers(0, v.size, size=(N_BOOT, v.size))].mean(-1) for v in per_n], axis=-1)
    lo, hi = np.quantile(fit(boot), [0.025, 0.975])
    return {"slope": point, "slope_lo": float(lo), "slope_hi": float(hi)}


def switch_ratios(n_tokens: int, betas: Sequence[float], *, tokens: str = "simplex", d_model: int = 64,
                  n_samples: int = 4, seed: int = 0) -> np.ndarray:
    """``r = m(1) / m(0)`` ``(n_samples, len(betas))``, ``m = μ/‖X‖_F``, of one complete-mask layer
    ``X(1) = sphere(softmax(β X Xᵀ) X)`` (docs/phase.md, "Temperature against sequence length")
    on the input ``tokens`` drawn by :func:`~rankcollapse.dynamics.inputs.make_tokens` with ``seed``."""
    N = check_int(n_tokens, "n_tokens", low=2)
    X = make_tokens(canonical_input(tokens), check_int(n_samples, "n_samples", low=1), N,
                    check_int(d_model, "d_model", low=2), seed=check_int(seed, "seed", low=0))  # (B, N, d)
    check_memory(3 * N * N * 8, f"one layer's attention over {N} tokens", None)
    m0 = mu_relative(X)  # (B,)
    out = np.empty((X.shape[0], len(betas)))
    for b, x in enumerate(X):
        scores = x @ x.T  # (N, N)
        for k, beta in enumerate(betas):
            y = torch.softmax(float(beta) * scores, dim=-1) @ x  # (N, d)
            y = y / torch.linalg.vector_norm(y, dim=-1, keepdim=True)
            out[b, k] = float(mu_relative(y) / m0[b])
    return out


def simplex_switch_ratio(n_tokens: int, rho: float, betas: Sequence[float]) -> np.ndarray:
    """:func:`switch_ratios` ``(len(betas),)`` for exactly equiangular unit tokens (Gram
    ``(1 - ρ) I + ρ 11ᵀ``): with ``w = e^{-β(1 - ρ)}``, ``α = (1 - w) / (1 + (N - 1) w)``,
    ``c = w / (1 + (N - 1) w)``, ``r = α / sqrt(α² + (2αc + N c²)(1 + ρ (N - 1)))``."""
    N = check_int(n_tokens, "n_tokens", low=2)
    if not 0 <= rho < 1:
        raise ConfigError(f"rho must be in [0, 1), got {rho}")
    w = np.exp(-np.asarray(betas, dtype=np.float64) * (1 - rho))
    alpha, c = (1 - w) / (1 + (N - 1) * w), w / (1 + (N - 1) * w)
    return alpha / np.sqrt(alpha**2 + (2 * alpha * c + N * c**2) * (1 + rho * (N - 1)))
