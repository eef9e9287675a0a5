"""Numerical search for SA-LN equilibria (docs/theory.md §5): from seeded uniform starts, a damped
fixed-point phase (part of the starts skip it), then tangent Newton steps; converged states are
deduplicated by max-abs distance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..dynamics.layers import sphere
from ..dynamics.inputs import sphere_tokens
from ..errors import ConfigError, ConvergenceError
from ..metrics import numerical_rank
from .equilibria import Equilibrium, EquilibriumSet
from .stability import tangent_basis
from .system import AttentionSystem, as_system


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
    g = torch.Generator().manual_seed(s.seed)
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
