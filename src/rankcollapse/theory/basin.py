"""Monte Carlo basin sizes of SA-LN equilibria (spec.md §5.3; docs/theory.md §4): uniform
starts on ``(S^{d-1})^N`` run ``depth`` steps; the fraction ending at a rank-``k`` fixed point
gets a binomial confidence interval."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from scipy.stats import binomtest

from .._display import NotebookResult
from .._memory import check_memory
from .._progress import steps
from ..dynamics.inputs import sphere_tokens
from ..metrics import numerical_rank
from ..errors import ConfigError, ConvergenceError
from .equilibria import causal_example_2x2
from .system import AttentionSystem, as_system


@dataclass
class BasinEstimate(NotebookResult):
    """Fraction of random starts converging to a rank-``target_rank`` fixed point."""

    target_rank: int
    n_samples: int
    n_hits: int
    fraction: float
    ci_low: float
    ci_high: float
    confidence: float
    method: str
    seed: int
    depth: int
    n_converged: int
    rank_counts: dict[int, int]

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def run_sa_ln(system: AttentionSystem, X0: torch.Tensor, depth: int, progress: bool | None = False) -> torch.Tensor:
    """``depth`` SA-LN steps from ``X0`` ``(B, N, d)`` in float64 (``progress``: a bar on stderr)."""
    system = as_system(system)
    X = X0.to(torch.float64)
    with steps(depth, "basin: layers", progress) as bar:
        for _ in range(depth):  # loop over layers only
            X = system.step(X, check=False)
            bar.advance()
    return X


def classify(system: AttentionSystem, X: torch.Tensor, *, conv_tol: float = 1e-8, rank_rtol: float = 1e-6):
    """Per-sample ``(numerical rank, max |F(X) - X| ≤ conv_tol)`` of states ``(B, N, d)``;
    non-finite states count as not converged."""
    finite = torch.isfinite(X).flatten(1).all(1)
    rank = numerical_rank(torch.where(finite[:, None, None], X, torch.zeros_like(X)), rtol=rank_rtol).long()
    res = (system.step(X, check=False) - X).flatten(1).abs().amax(1)
    return rank, finite & torch.isfinite(res) & (res <= conv_tol)


def basin_estimate(system: AttentionSystem | None = None, *, target_rank: int | None = None, n_samples: int = 4000,
                   seed: int = 0, depth: int = 400, confidence: float = 0.95, method: str = "wilson",
                   progress: bool | None = None) -> BasinEstimate:
    """Estimate the fraction of uniform random starts ending at a rank-``target_rank`` (default
    ``min(N, d)``) equilibrium of ``system`` (default :func:`causal_example_2x2`); ``method``: the
    ``"wilson"`` or ``"exact"`` interval of ``scipy.stats.binomtest``; ``progress``: a bar on stderr
    (None = only on a terminal).

    Raises ConfigError for ``n_samples`` or ``depth`` < 1, a rank out of range, an unknown method,
    ``confidence`` outside (0, 1) or a step undefined for every start; MemoryLimitError when one
    step over the starts would not fit half the memory; ConvergenceError when no start converged.
    """
    system = (system or causal_example_2x2().system).to(torch.float64)
    N, d = system.n_tokens, system.dim
    k = min(N, d) if target_rank is None else target_rank
    if n_samples < 1 or depth < 1 or not 1 <= k <= min(N, d):
        raise ConfigError(f"need n_samples ≥ 1, depth ≥ 1, 1 ≤ target_rank ≤ {min(N, d)}; "
                          f"got n_samples={n_samples}, depth={depth}, target_rank={k}")
    if method not in ("wilson", "exact"):
        raise ConfigError(f"method must be 'wilson' or 'exact', got {method!r}")
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be strictly between 0 and 1, got {confidence}")
    # one SA-LN step over every start: scores and weights (B, N, N) and the tokens' copies (B, N, d)
    check_memory(8 * n_samples * (4 * N * N + 10 * N * d), f"{n_samples} SA-LN starts of N = {N}, d = {d}",
                 adjustable=False)
    g = torch.Generator().manual_seed(seed)
    X = run_sa_ln(system, sphere_tokens(n_samples, N, d, generator=g), depth, progress)
    finite = torch.isfinite(X).flatten(1).all(1)
    if not bool(finite.any()):
        raise ConfigError(f"SA-LN step undefined: a row of A X W_V became zero before normalisation "
                          f"for all {n_samples} starts (W_V singular on the tokens' span?)")
    rank, conv = classify(system, X)
    if not bool(conv.any()):
        raise ConvergenceError(f"none of {n_samples} starts (seed {seed}) reached a fixed point within {depth} "
                               "SA-LN steps (tolerance 1e-8); try a larger depth, or the system may have no "
                               "attracting equilibrium")
    hits = int(((rank == k) & conv).sum())
    ci = binomtest(hits, n_samples).proportion_ci(confidence_level=confidence, method=method)
    counts = {int(r): int((rank[conv] == r).sum()) for r in torch.unique(rank[conv]).tolist()}
    return BasinEstimate(k, n_samples, hits, hits / n_samples, float(ci.low), float(ci.high), confidence,
                         method, seed, depth, int(conv.sum()), counts)
