"""Linear stability of SA-LN equilibria on ``(S^{d-1})^N`` (docs/theory.md §4): with ``Q`` an
orthonormal basis of the tangent space ``Π_i x_i^⊥``, ``X`` is linearly stable iff the spectral
radius of ``Q^T J Q`` (``J = ∂ vec F / ∂ vec X``) is < 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .._display import NotebookResult
from ..errors import ConfigError
from .system import AttentionSystem, as_state, as_system

#: Eigenvalue moduli within this of 1 are reported as "neutral" (linearisation undecided).
NEUTRAL_TOL = 1e-9


def tangent_basis(X: torch.Tensor) -> torch.Tensor:
    """Block-diagonal orthonormal basis ``(..., N d, N (d-1))`` of ``Π_i x_i^⊥`` for ``X``
    ``(..., N, d)`` (per token the last ``d-1`` right singular vectors of ``x_i``)."""
    X = as_state(X)
    *batch, N, d = X.shape
    _, _, Vh = torch.linalg.svd(X.unsqueeze(-2))  # (..., N, d, d)
    blocks = Vh[..., 1:, :].transpose(-1, -2)  # (..., N, d, d-1)
    eye = torch.eye(N, dtype=X.dtype, device=X.device)
    return torch.einsum("ij,...iab->...iajb", eye, blocks).reshape(*batch, N * d, N * (d - 1))


def jacobian(system: AttentionSystem, X: torch.Tensor) -> torch.Tensor:
    """Full Jacobian ``∂ vec F(X) / ∂ vec X`` of the SA-LN step, ``(N d, N d)`` float64."""
    system = as_system(system)
    X = as_state(X, system)
    return torch.autograd.functional.jacobian(system.step, X).reshape(X.numel(), X.numel())  # from (N, d, N, d)


def tangent_jacobian(system: AttentionSystem, X: torch.Tensor) -> torch.Tensor:
    """``Q^T J Q``: the SA-LN step's derivative on the tangent space at ``X``, ``(N(d-1),)*2``."""
    X = as_state(X, as_system(system))
    Q = tangent_basis(X)
    return Q.T @ jacobian(system, X) @ Q


@dataclass
class StabilityReport(NotebookResult):
    """Eigenvalues ``(N(d-1),)`` of the tangent Jacobian; per direction ``m`` the ``token`` carrying
    most of eigenvector ``m`` and a verdict (``"stable"``, ``"unstable"`` or ``"neutral"``)."""

    eigenvalues: torch.Tensor
    token: list[int]
    verdicts: list[str]
    spectral_radius: float

    @property
    def stable(self) -> bool:
        return self.spectral_radius < 1.0 - NEUTRAL_TOL

    @property
    def n_unstable(self) -> int:
        return self.verdicts.count("unstable")

    def to_pandas(self) -> Any:
        """One row per tangent direction: ``eigenvalue_real, eigenvalue_imag, modulus, token, verdict``."""
        import pandas as pd

        ev = self.eigenvalues.to(torch.complex128)
        return pd.DataFrame({"eigenvalue_real": ev.real.numpy(), "eigenvalue_imag": ev.imag.numpy(),
                             "modulus": ev.abs().numpy(), "token": list(self.token), "verdict": list(self.verdicts)})

    def _facts(self) -> dict[str, Any]:
        return {"stable": self.stable, "spectral_radius": self.spectral_radius, "n_unstable": self.n_unstable}

    def to_dict(self) -> dict[str, Any]:
        directions = [{"eigenvalue": [float(z.real), float(z.imag)], "modulus": float(abs(z)), "token": t, "verdict": v}
                      for z, t, v in zip(self.eigenvalues.tolist(), self.token, self.verdicts)]
        return {"stable": self.stable, "spectral_radius": self.spectral_radius, "n_unstable_directions": self.n_unstable,
                "directions": directions}


def stability(system: AttentionSystem, X: torch.Tensor) -> StabilityReport:
    """Stability verdict of the SA-LN equilibrium ``X`` ``(N, d)`` per tangent direction. Raises
    ConfigError for a ``system`` that is not an :class:`AttentionSystem`, ``X`` not its state, or
    a step undefined at ``X``."""
    X = as_state(X, as_system(system))
    if X.ndim != 2:
        raise ConfigError(f"X must be one state (N, d), got shape {tuple(X.shape)}")
    N, d = X.shape
    if d == 1:  # the sphere S^0 is two points: no tangent directions
        return StabilityReport(torch.zeros(0, dtype=torch.complex128), [], [], 0.0)
    T = tangent_jacobian(system, X)
    vals, vecs = torch.linalg.eig(T)
    mass = (vecs.abs() ** 2).reshape(N, d - 1, -1).sum(dim=1)  # (N, n_dirs)
    token = mass.argmax(dim=0).tolist()
    mod = vals.abs()
    verdicts = ["unstable" if m > 1 + NEUTRAL_TOL else "stable" if m < 1 - NEUTRAL_TOL else "neutral" for m in mod.tolist()]
    order = torch.argsort(mod, descending=True)
    return StabilityReport(vals[order], [token[i] for i in order], [verdicts[i] for i in order], float(mod.max()))
