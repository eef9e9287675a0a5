"""Initial token matrices ``X(0)`` for the simulator: Gaussian, sphere, hemisphere.

All return float64 ``(B, N, d)`` drawn from a CPU generator seeded by ``seed`` (same
seed, same numbers on every machine); cast with ``.to(dtype, device)``. Real token
embeddings come from :func:`rankcollapse.models.embed`.
"""

from __future__ import annotations

import torch

from .._validate import check_int
from ..errors import ConfigError
from .layers import sphere


def _check(batch: int, n_tokens: int, d: int) -> None:
    for name, value in (("batch", batch), ("n_tokens", n_tokens), ("d", d)):
        check_int(value, name, low=1)


def gaussian_tokens(batch: int, n_tokens: int, d: int, *, seed: int = 0, std: float = 1.0,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """i.i.d. ``N(0, std^2)`` entries, shape ``(batch, n_tokens, d)``; drawn from
    ``generator`` instead of a fresh one seeded by ``seed`` when given."""
    _check(batch, n_tokens, d)
    gen = torch.Generator().manual_seed(check_int(seed, "seed", low=0)) if generator is None else generator
    return torch.randn(batch, n_tokens, d, generator=gen, dtype=torch.float64) * std


def sphere_tokens(batch: int, n_tokens: int, d: int, *, seed: int = 0,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Tokens uniform on the unit sphere ``S^{d-1}`` (normalised Gaussians; Muller 1959),
    projected by :func:`~rankcollapse.dynamics.layers.sphere`."""
    return sphere(gaussian_tokens(batch, n_tokens, d, seed=seed, generator=generator))[0]


def hemisphere_tokens(batch: int, n_tokens: int, d: int, *, seed: int = 0, pole: torch.Tensor | None = None,
                      ) -> torch.Tensor:
    """Tokens uniform on the open hemisphere ``{x in S^{d-1}: <x, pole> > 0}`` (default
    pole ``e_1``): sphere samples reflected across the pole's hyperplane when needed, so
    every pair has ``<x_i, pole> > 0`` (the initial condition of spec.md §5.2).

    Raises
    ------
    ConfigError
        ``pole`` of the wrong shape or zero.
    """
    X = sphere_tokens(batch, n_tokens, d, seed=seed)
    p = torch.zeros(d, dtype=torch.float64) if pole is None else torch.as_tensor(pole, dtype=torch.float64)
    if pole is None:
        p[0] = 1.0
    if p.shape != (d,) or not bool(p.norm() > 0):
        raise ConfigError(f"pole must be a nonzero vector of length {d}")
    p = p / p.norm()
    c = X @ p  # (B, N)
    X = X - 2 * torch.clamp(c, max=0.0).unsqueeze(-1) * p
    return X
