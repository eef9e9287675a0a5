"""Equilibria of SA-LN: the N = d = 2 causal example and a construction of every rank
(docs/theory.md §3). Causal mask, ``W_Q = W_K = 0``: the step is ``x_i ↦ normalise(S_i W_V)``,
``S_i = Σ_{j≤i} x_j``, and ``X`` is an equilibrium iff ``S_i W_V = α_i x_i`` with ``α_i > 0``.

The numerical search of any system (:func:`find_equilibria`, docs/theory.md §5): from seeded uniform
starts, a damped fixed-point phase (part of the starts skip it), then tangent Newton steps; converged
states are deduplicated by max-abs distance.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from scipy.optimize import brentq

from .._display import NotebookResult
from .._memory import check_memory
from .._validate import check_int
from ..dynamics.inputs import seeded_generator, sphere_tokens
from ..dynamics.layers import sphere
from ..dynamics.weights import RHO, construction_eigenvalues  # the W_V of the construction: a weight family
from ..errors import ConfigError, ConvergenceError
from ..metrics import numerical_rank
from .stability import stability, tangent_basis
from .system import AttentionSystem, as_system, causal_uniform_system, fixed_point_residual

#: Largest rank the construction builds in float64 (ρ^(k-1) must stay finite and well scaled).
MAX_RANK = 500
#: Largest number of equilibria enumerated without an explicit ``limit``.
MAX_ENUMERATED = 4096
FIXED_POINT_TOL = 1e-10
#: Rank of a constructed equilibrium: singular values above ``RANK_RTOL · σ_1`` (root finding
#: is accurate to ~1e-12, which numpy's ``max(N, d) eps`` rule would count).
RANK_RTOL = 1e-8


@dataclass
class Equilibrium:
    """One SA-LN equilibrium ``X`` ``(N, d)`` float64 with its rank and fixed-point error."""

    X: torch.Tensor
    rank: int
    residual: float
    signs: tuple[int, ...] = ()
    stability: Any = None  # StabilityReport, filled by ``with_stability``

    @property
    def stable(self) -> bool | None:
        return None if self.stability is None else bool(self.stability.stable)

    def to_dict(self) -> dict[str, Any]:
        out = {"X": self.X.tolist(), "rank": self.rank, "stable": self.stable, "residual": self.residual}
        if self.signs:
            out["signs"] = list(self.signs)
        if self.stability is not None:
            out["stability"] = self.stability.to_dict()
        return out

    def to_pandas(self) -> Any:
        """Tidy :class:`pandas.DataFrame` ``token, coordinate, value`` of ``X``."""
        import pandas as pd

        N, d = self.X.shape
        return pd.DataFrame({"token": np.repeat(np.arange(N), d), "coordinate": np.tile(np.arange(d), N),
                             "value": self.X.detach().double().cpu().reshape(-1).numpy()})


@dataclass
class EquilibriumSet(NotebookResult):
    """A system and equilibria of it (``equilibria`` list), JSON-ready via ``to_dict``."""

    system: AttentionSystem
    equilibria: list[Equilibrium]
    info: dict[str, Any] = field(default_factory=dict)

    def with_stability(self) -> "EquilibriumSet":
        """Attach a tangent-space stability report to every equilibrium (in place)."""
        for eq in self.equilibria:
            eq.stability = stability(self.system, eq.X)
        return self

    def to_pandas(self) -> Any:
        """One row per equilibrium: ``rank, residual, stable, spectral_radius, signs, X``."""
        import pandas as pd

        return pd.DataFrame([{"rank": e.rank, "residual": e.residual, "stable": e.stable,
                              "spectral_radius": None if e.stability is None else e.stability.spectral_radius,
                              "signs": list(e.signs), "X": e.X.tolist()} for e in self.equilibria],
                            columns=["rank", "residual", "stable", "spectral_radius", "signs", "X"])

    def _facts(self) -> dict[str, Any]:
        return {"n_tokens": self.system.n_tokens, "dim": self.system.dim, "n_equilibria": len(self.equilibria),
                **{k: v for k, v in self.info.items() if isinstance(v, (bool, int, float, str))}}

    def to_dict(self) -> dict[str, Any]:
        return {**self.system.to_dict(), "equilibria": [e.to_dict() for e in self.equilibria], "info": self.info}


def causal_example_2x2() -> EquilibriumSet:
    """All ten equilibria of the ``N = d = 2`` causal example of spec.md §5.3, in closed form
    (``W_V = [[1, -3], [0, 2]]``; docs/theory.md §3a). Order, each for ``s = +1`` then ``-1``:

    ``[s(0, 1), B]`` and ``[s(0, 1), B']`` (``signs = (s, ±1)``; ``B = ((6-√6)/10, -(2+3√6)/10)``
    is stable), ``s[(0,1), (0,1)]``, ``s[(1,3), (1,3)]/√10``, ``s[(1,3), (1,-3)]/√10``.
    ``info["labels"]`` names each one; ``info["B"]`` is B.
    """
    W_V = torch.tensor([[1.0, -3.0], [0.0, 2.0]], dtype=torch.float64)
    system = causal_uniform_system(W_V, 2)
    r6, r10 = math.sqrt(6), math.sqrt(10)
    top, low = (0.0, 1.0), (1 / r10, 3 / r10)
    cases = []
    for s, beta in itertools.product((1, -1), ((6 - r6) / 10, (6 + r6) / 10)):
        name = "B" if beta < 0.6 else "B'"
        cases.append(((s, 1 if beta < 0.6 else -1), f"{'+' if s > 0 else '-'}[(0,1), {name}]", s, top, (beta, 3 * beta - 2)))
    for s in (1, -1):
        sign = "+" if s > 0 else "-"
        cases.append(((), f"{sign}[(0,1), (0,1)]", s, top, top))
        cases.append(((), f"{sign}[(1,3), (1,3)]/√10", s, low, low))
        cases.append(((), f"{sign}[(1,3), (1,-3)]/√10", s, low, (1 / r10, -3 / r10)))
    eqs, labels = [], []
    for signs, label, s, x0, x1 in cases:
        X = s * torch.tensor([x0, x1], dtype=torch.float64)
        eqs.append(Equilibrium(X, int(numerical_rank(X, rtol=RANK_RTOL)), fixed_point_residual(system, X), signs))
        labels.append(label)
    B = ((6 - r6) / 10, -(2 + 3 * r6) / 10)
    return EquilibriumSet(system, eqs, {"construction": "causal_example_2x2", "B": B, "labels": labels})


def _token_after_rank(S: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Token ``t ≥ k``: ``x_j = λ_j S_j / (α - λ_j)`` with the unique ``α > max λ`` making ``‖x‖ = 1``."""
    top = lam.max()

    def excess(alpha: float) -> float:
        return float(np.sum((lam * S / (alpha - lam)) ** 2) - 1.0)

    hi = top + 2.0 * float(np.abs(lam * S).sum()) + 1.0
    lo = top * (1 + 1e-15) + 1e-300
    for _ in range(60):  # f → ∞ as α ↓ max λ (S at the top coordinate is ≠ 0, proven)
        if excess(lo) > 0:
            break
        lo = top + (lo - top) * 1e-3
    alpha = brentq(excess, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)
    x = lam * S / (alpha - lam)
    return x / np.linalg.norm(x)


def construct_equilibrium(n_tokens: int, lam: np.ndarray, signs: tuple[int, ...]) -> np.ndarray:
    """The ``(n_tokens, d)`` float64 equilibrium of the rank-``k`` construction with sign pattern
    ``signs`` (length k) and eigenvalues ``lam`` ``(d,)``: tokens ``t < k`` have
    ``x_t[j] = λ_j S_{t-1}[j] / (λ_t - λ_j)`` for ``j < t``, ``x_t[t] = s_t sqrt(1 - Σ_{j<t} x_t[j]²)``;
    later ones :func:`_token_after_rank`."""
    k, d = len(signs), lam.shape[0]
    X = np.zeros((n_tokens, d))
    S = np.zeros(d)
    for t in range(n_tokens):
        x = np.zeros(d)
        if t < k:
            x[:t] = lam[:t] * S[:t] / (lam[t] - lam[:t])
            rest = 1.0 - float(np.sum(x[:t] ** 2))
            assert rest > 0, "construction lemma violated"  # proven: rest ≥ 1 - B²τ(ρ) ≈ 0.65
            x[t] = signs[t] * math.sqrt(rest)
        else:
            x[:k] = _token_after_rank(S[:k], lam[:k])
        X[t] = x
        S = S + x
    return X


def equilibria(n_tokens: int, d_model: int, rank: int, *, limit: int | None = None, stability: bool = True) -> EquilibriumSet:
    """A system with at least ``2^rank`` distinct SA-LN equilibria of rank exactly ``rank``:
    causal mask, ``W_Q = W_K = 0``, ``W_V = diag(λ)`` (:func:`construction_eigenvalues`); one
    equilibrium per sign pattern ``s ∈ {±1}^rank``, each verified (residual ≤ 1e-10, rank);
    proof in docs/theory.md §3b. ``limit``: only the first ``limit`` patterns (required above
    4096); ``stability``: attach a tangent-space stability report to each. Raises ConfigError for
    ``rank`` outside ``1..min(N, d)`` or above ``MAX_RANK``, ``2^rank > 4096`` without ``limit``, or
    ``n_tokens``, ``d_model``, ``limit`` not an integer ``>= 1``; MemoryLimitError when the system
    (and tangent Jacobians) would not fit half the memory.
    """
    n, d = check_int(n_tokens, "n_tokens", low=1), check_int(d_model, "d_model", low=1)
    rank = check_int(rank, "rank")
    limit = None if limit is None else check_int(limit, "limit", low=1)
    if not 1 <= rank <= min(n, d):
        raise ConfigError(f"rank must satisfy 1 ≤ rank ≤ min(N, d) = {min(n, d)}, got {rank}")
    if rank > MAX_RANK:
        raise ConfigError(f"rank {rank} > {MAX_RANK}: eigenvalue ratios 4^(rank-1) leave float64's range")
    count = 2**rank if limit is None else min(limit, 2**rank)
    if limit is None and count > MAX_ENUMERATED:
        raise ConfigError(f"2^{rank} equilibria are too many to list; pass limit (e.g. limit=64)")
    # the (N, N) mask and attention, W_V, and with stability about 8 matrices of side N d
    check_memory(9 * n * n + 8 * d * d + (64 * (n * d) ** 2 if stability else 0),
                 f"the equilibria of N = {n}, d = {d}" + (" with their stability" if stability else ""),
                 adjustable=False)
    lam = construction_eigenvalues(d, rank)
    system = causal_uniform_system(torch.diag(torch.tensor(lam)), n)
    eqs = []
    for signs in itertools.islice(itertools.product((1, -1), repeat=rank), count):
        X = torch.from_numpy(construct_equilibrium(n, lam, signs))
        eq = Equilibrium(X, int(numerical_rank(X, rtol=RANK_RTOL)), fixed_point_residual(system, X), tuple(signs))
        if eq.residual > FIXED_POINT_TOL or eq.rank != rank:
            raise ConfigError(f"construction failed for signs {signs}: residual {eq.residual:.2e}, rank {eq.rank}")
        eqs.append(eq)
    out = EquilibriumSet(system, eqs, {"construction": "causal_diagonal", "rho": RHO, "eigenvalues": lam.tolist()})
    return out.with_stability() if stability else out


@dataclass
class FinderSettings:
    """What the finder tries; echoed in results and in ``ConvergenceError`` messages."""

    n_starts: int = 64
    seed: int = 0
    damping: float = 0.5
    fixed_point_iters: int = 200
    newton_iters: int = 30
    newton_only_fraction: float = 0.5
    tol: float = 1e-10
    dedup_tol: float = 1e-4
    rank_rtol: float = 1e-4
    batch: int = 16

    def describe(self) -> str:
        return (f"{self.n_starts} seeded starts (seed {self.seed}), {self.fixed_point_iters} damped fixed-point "
                f"iterations (damping {self.damping}; skipped for a fraction {self.newton_only_fraction} of starts) "
                f"then up to {self.newton_iters} tangent Newton steps, tol {self.tol:g}")


@dataclass
class FinderResult(EquilibriumSet):
    """Equilibria found, with how many starts converged."""

    n_converged: int = 0
    n_starts: int = 0
    settings: dict[str, Any] = field(default_factory=dict)


def _batched_jacobians(system: AttentionSystem, X: torch.Tensor) -> torch.Tensor:
    """Per-sample Jacobians ``(B, N d, N d)`` of the step (samples do not interact)."""
    B, N, d = X.shape
    J = torch.autograd.functional.jacobian(lambda Z: system.step(Z, check=False), X, vectorize=True)
    J = J.reshape(B, N * d, B, N * d)
    idx = torch.arange(B)
    return J[idx, :, idx, :]


def _newton(system: AttentionSystem, X: torch.Tensor, iters: int, tol: float) -> torch.Tensor:
    """Tangent-space Newton on a batch ``(B, N, d)``; converged samples are left alone."""
    B, N, d = X.shape
    for _ in range(iters):
        R = system.step(X, check=False) - X
        todo = R.flatten(1).abs().amax(dim=1) > tol
        todo &= torch.isfinite(R.flatten(1)).all(dim=1)
        if not bool(todo.any()):
            break
        Xt = X[todo]
        Q = tangent_basis(Xt)  # (b, Nd, N(d-1)); b ≤ batch size
        J = _batched_jacobians(system, Xt)
        eye = torch.eye(N * d, dtype=X.dtype)
        M = Q.transpose(1, 2) @ (J - eye) @ Q
        rhs = -(Q.transpose(1, 2) @ R[todo].reshape(-1, N * d, 1))
        delta = torch.linalg.lstsq(M, rhs).solution
        X = X.clone()
        X[todo] = sphere((Xt.reshape(-1, N * d, 1) + Q @ delta).reshape(-1, N, d))[0]
    return X


def _dedup(states: torch.Tensor, tol: float) -> list[torch.Tensor]:
    kept: list[torch.Tensor] = []
    for X in states:
        if not any(float((X - Y).abs().max()) <= tol for Y in kept):
            kept.append(X)
    return kept


def find_equilibria(system: AttentionSystem, settings: FinderSettings | None = None, *,
                    starts: torch.Tensor | None = None, **overrides: Any) -> FinderResult:
    """Distinct equilibria of the SA-LN step of ``system`` (residual ≤ ``tol``, rank, stability),
    sorted by rank then residual. ``overrides`` replace fields of ``settings``; ``starts`` ``(B, N, d)``
    go straight to Newton (with them, ``n_starts = 0`` searches from them alone). Raises
    ConvergenceError when no start converges (naming what was tried), ConfigError for a setting
    out of range or a step undefined at every state tried.
    """
    s = settings or FinderSettings()
    for k, v in overrides.items():
        if not hasattr(s, k):
            raise ConfigError(f"unknown finder setting {k!r}")
        setattr(s, k, v)
    if (s.n_starts < (0 if starts is not None else 1) or not 0 < s.damping <= 1 or s.batch < 1
            or not 0 <= s.newton_only_fraction <= 1):
        raise ConfigError(f"bad finder settings: {s}")
    system = as_system(system)
    g = seeded_generator(s.seed)
    X = (sphere_tokens(s.n_starts, system.n_tokens, system.dim, generator=g) if s.n_starts
         else torch.empty(0, system.n_tokens, system.dim, dtype=torch.float64))
    # Damped iteration only reaches stable equilibria: part of the starts go to Newton directly.
    n_fp = s.n_starts - int(round(s.newton_only_fraction * s.n_starts))
    for _ in range(s.fixed_point_iters):
        X[:n_fp] = sphere((1 - s.damping) * X[:n_fp] + s.damping * system.step(X[:n_fp], check=False))[0]
    if starts is not None:  # given starts go straight to Newton
        if starts.ndim != 3 or starts.shape[1:] != X.shape[1:]:
            raise ConfigError(f"starts must be (B, {system.n_tokens}, {system.dim}), got {tuple(starts.shape)}")
        X = torch.cat([sphere(starts.to(torch.float64))[0], X])
    X = torch.cat([_newton(system, chunk, s.newton_iters, s.tol) for chunk in X.split(s.batch)])
    res = (system.step(X, check=False) - X).flatten(1).abs().amax(dim=1)
    ok = torch.isfinite(res) & (res <= s.tol)
    if not bool(ok.any()):
        if not bool(torch.isfinite(res).any()):
            raise ConfigError(f"SA-LN step undefined: a row of A X W_V is zero before normalisation at "
                              f"every state tried ({s.describe()})")
        best = float(res[torch.isfinite(res)].min())
        raise ConvergenceError(f"no equilibrium found: tried {s.describe()}; best residual {best:.3g}")
    found = _dedup(X[ok], s.dedup_tol)
    eqs = [Equilibrium(x, int(numerical_rank(x, rtol=s.rank_rtol)), float((system.step(x) - x).abs().max())) for x in found]
    eqs.sort(key=lambda e: (e.rank, e.residual))
    return FinderResult(system, eqs, {"finder": s.describe()}, int(ok.sum()), X.shape[0], vars(s).copy()).with_stability()
