"""Monte Carlo basin sizes of SA-LN equilibria (spec.md §5.3; docs/theory.md §4): uniform
starts on ``(S^{d-1})^N`` run ``depth`` steps; the fraction ending at a rank-``k`` fixed point
gets a binomial confidence interval. Phase portraits (docs/theory.md §6): the final against the
starting angle of token 1 in the ``N = d = 2`` example, and token paths on the sphere for ``d = 3``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import binomtest

from .._display import NotebookResult, fixed
from .._figure import colour, new_axes, save_figure
from .._memory import check_memory
from .._progress import steps
from ..dynamics.inputs import seeded_generator, sphere_tokens
from ..metrics import numerical_rank
from ..errors import ConfigError, ConvergenceError
from .equilibria import causal_example_2x2
from .system import AttentionSystem, as_system, causal_uniform_system


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
    g = seeded_generator(seed)
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


def portrait_2d_data(system: AttentionSystem | None = None, *, n_angles: int = 721, depth: int = 400) -> dict[str, Any]:
    """Final angle (degrees) of token 1 per starting angle, for token 0 starting at ``±(0, 1)``.

    Returns ``{"start_deg": (n,), "final_deg": {+1: (n,), -1: (n,)}, "rank2": {±1: bool (n,)}}``.
    """
    system = (system or causal_example_2x2().system).to(torch.float64)
    if system.n_tokens != 2 or system.dim != 2:
        raise ConfigError("portrait_2d needs an N = d = 2 system")
    theta = torch.linspace(-180.0, 180.0, n_angles, dtype=torch.float64)
    tok1 = torch.stack([torch.cos(torch.deg2rad(theta)), torch.sin(torch.deg2rad(theta))], dim=-1)
    out: dict[str, Any] = {"start_deg": theta.numpy(), "final_deg": {}, "rank2": {}}
    for s in (1, -1):
        tok0 = torch.tensor([0.0, float(s)], dtype=torch.float64).expand(n_angles, 2)
        X = run_sa_ln(system, torch.stack([tok0, tok1], dim=1), depth)
        final = torch.rad2deg(torch.atan2(X[:, 1, 1], X[:, 1, 0]))
        out["final_deg"][s] = final.numpy()
        out["rank2"][s] = (torch.linalg.det(X).abs() > 1e-6).numpy()
    return out


def portrait_2d(path: str | Path | None = None, *, ax: Any = None, **kwargs: Any) -> dict[str, Any]:
    """:func:`portrait_2d_data` (``kwargs``) drawn by :func:`plot_portrait_2d` (on ``ax``; a PNG at
    ``path`` when given); returns the data."""
    data = portrait_2d_data(**kwargs)
    fig = plot_portrait_2d(data, kwargs.get("system"), ax=ax)
    if path is not None:
        save_figure(fig, path, dpi=120)
    return data


def plot_portrait_2d(data: dict[str, Any], system: AttentionSystem | None = None, *, ax: Any = None) -> Any:
    """Draw :func:`portrait_2d_data`'s output; returns the figure. ``system`` (for the title):
    the one the data came from, default the ``N = d = 2`` causal example."""
    system = system or causal_example_2x2().system
    fig, ax = new_axes(ax, figsize=(6.4, 4.6))
    for s, color in ((1, "tab:blue"), (-1, "tab:orange")):
        ax.scatter(data["start_deg"], data["final_deg"][s], s=4, color=color,
                   label=f"token 0 starts at {'+' if s > 0 else '-'}(0, 1)")
    finals = np.concatenate([data["final_deg"][1], data["final_deg"][-1]])
    for y in np.unique(np.round(finals[np.isfinite(finals)], 3)):  # the limits actually reached
        ax.axhline(y, color="grey", lw=0.5, ls=":")
        ax.annotate(f"{fixed(y, '.2f')}°", (180, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set(xlabel="starting angle of token 1 (deg)", ylabel="final angle of token 1 (deg)",
           title=f"SA-LN, N = d = 2, causal, W_V = {_matrix_text(system.W_V)}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def _matrix_text(W: torch.Tensor) -> str:
    """``[[1, -3], [0, 2]]``: a small matrix, entries to 4 significant digits."""
    return "[" + ", ".join("[" + ", ".join(f"{float(v):.4g}" for v in row) + "]" for row in W) + "]"


def _pick_starts(system: AttentionSystem, n_starts: int, depth: int, generator: torch.Generator) -> torch.Tensor:
    """``n_starts`` random starts, about half ending above rank 1 when any of a pool of ``32 n_starts`` does."""
    pool = sphere_tokens(32 * n_starts, system.n_tokens, 3, generator=generator)
    high = torch.linalg.matrix_rank(run_sa_ln(system, pool, depth), rtol=1e-6) > 1
    idx_high, idx_low = high.nonzero().flatten(), (~high).nonzero().flatten()
    n_high = min(len(idx_high), n_starts // 2)
    chosen = torch.cat([idx_high[:n_high], idx_low[: n_starts - n_high]])
    return pool[chosen]


def trajectories_3d(path: str | Path | None = None, system: AttentionSystem | None = None, *, n_starts: int = 6,
                    depth: int = 60, seed: int = 0) -> np.ndarray:
    """Token trajectories ``(depth+1, B, N, 3)`` on the unit sphere (a PNG at ``path`` when given).
    Default system: the ``N = d = 2`` example lifted to ``N = d = 3``
    (``W_V = diag([[1, -3], [0, 2]], 1/2)``); starts: ``_pick_starts``."""
    if system is None:
        W_V = torch.zeros(3, 3, dtype=torch.float64)
        W_V[:2, :2] = causal_example_2x2().system.W_V
        W_V[2, 2] = 0.5
        system = causal_uniform_system(W_V, 3)
    system = as_system(system)
    if system.dim != 3:
        raise ConfigError(f"trajectories_3d needs d = 3, got d = {system.dim}")
    g = seeded_generator(seed)
    X = _pick_starts(system, n_starts, depth, g)
    path_states = [X]
    for _ in range(depth):
        X = system.step(X, check=False)
        path_states.append(X)
    traj = torch.stack(path_states).numpy()
    if path is not None:
        save_figure(plot_trajectories_3d(traj), path, dpi=110)
    return traj


def plot_trajectories_3d(traj: np.ndarray, *, ax: Any = None) -> Any:
    """Draw token paths ``traj`` ``(depth+1, B, N, 3)`` on the unit sphere (on a 3-D ``ax`` if given)."""
    traj = np.asarray(traj)
    depth, n_tokens = traj.shape[0] - 1, traj.shape[2]
    fig, ax = new_axes(ax, figsize=(6, 6), projection="3d")
    u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 40), np.linspace(0, np.pi, 20))
    ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="lightgrey", lw=0.3)
    colors = [colour(i) for i in range(n_tokens)]
    for b in range(traj.shape[1]):
        for i in range(n_tokens):
            p = traj[:, b, i]
            ax.plot(p[:, 0], p[:, 1], p[:, 2], ".-", color=colors[i], lw=0.4, ms=2,
                    label=f"token {i}" if b == 0 else None)
            ax.scatter(*p[-1], color=colors[i], s=60 - 15 * i, edgecolor="k", depthshade=False)
    n_high = sum(int(np.linalg.matrix_rank(x, tol=1e-6)) > 1 for x in traj[-1])
    ax.legend(loc="upper left", fontsize=8)
    ax.set(title=f"SA-LN token trajectories on S^2 (N = {n_tokens}, {depth} layers)\n"
           f"large dot = final state; {n_high} of {traj.shape[1]} starts end above rank 1")
    fig.tight_layout()
    return fig
