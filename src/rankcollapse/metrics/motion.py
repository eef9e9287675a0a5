"""How far tokens sit from the origin (``token_radius``) and how fast they turn from one
layer to the next (``angular_speed``), the speed of clustering that normalisations regulate
(Karagodin et al., NeurIPS 2025). The angle is ``2 asin(||u - v|| / 2)`` of the unit rows,
exact near 0 and pi where ``acos`` loses half the digits.
"""

from __future__ import annotations

import torch

from ..errors import MetricError
from ._context import MetricContext


def _token_radius(ctx: MetricContext) -> torch.Tensor:
    return ctx.row_norms.mean(dim=-1) * ctx.scale


def angular_speed(X_prev: torch.Tensor, X_next: torch.Tensor) -> torch.Tensor:
    """Mean angle (radians) ``(1/N) sum_i 2 asin(||u_i - v_i|| / 2)`` between the unit rows of
    ``X_prev`` ``X(t)`` and ``X_next`` ``X(t+1)``, ``(N, d)`` or ``(B, N, d)`` each: float64 ``()``
    or ``(B,)``, NaN for a sample with a zero token; :class:`MetricError` for other shapes."""
    if not (isinstance(X_prev, torch.Tensor) and isinstance(X_next, torch.Tensor)):
        raise MetricError(f"angular_speed needs two torch tensors, got {type(X_prev).__name__} and "
                          f"{type(X_next).__name__}")
    if X_prev.shape != X_next.shape or X_prev.ndim not in (2, 3):
        raise MetricError(f"angular_speed needs two token matrices of one shape (N, d) or (B, N, d), got "
                          f"{tuple(X_prev.shape)} and {tuple(X_next.shape)}")
    u, v = (_unit_rows(X.double()) for X in (X_prev, X_next))
    chord = torch.linalg.vector_norm(u - v, dim=-1).clamp_max(2.0)  # (B, N); <= 2 up to round-off
    return (2.0 * torch.asin(chord / 2.0)).mean(dim=-1)


def _unit_rows(X: torch.Tensor) -> torch.Tensor:
    """Rows to the unit sphere, without overflow; a zero row becomes NaN."""
    peak = X.abs().amax(dim=-1, keepdim=True)
    Y = X / peak
    return Y / torch.linalg.vector_norm(Y, dim=-1, keepdim=True)
