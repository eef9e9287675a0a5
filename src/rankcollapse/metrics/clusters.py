"""Cluster count of token directions: connected components (single linkage) of the graph
linking tokens at an angle below ``angle``, for the metastable states that precede collapse
(Bruno et al., ICLR 2025; :mod:`rankcollapse.theory.clusters`).
"""

from __future__ import annotations

import math

import torch

from .._validate import check_float
from ..errors import MetricError
from ._context import as_batch

#: Default link angle in radians (about 5.7 degrees): clusters of a metastable state (>= 2 pi / k
#: apart) never merge, and a cluster's own (exponentially shrinking) spread links up within a few layers.
CLUSTER_ANGLE = 0.1


def cluster_count(X, *, angle: float = CLUSTER_ANGLE) -> torch.Tensor:
    """Number of clusters of the token directions of ``X`` ``(N, d)`` or ``(B, N, d)`` (zero
    tokens left out), ``i, j`` linked when ``cos(x_i, x_j) >= cos(angle)``, ``angle`` in
    ``(0, pi]``: float64, 0-d or ``(B,)``. :class:`MetricError` for a bad X or ``angle``, or
    a sample whose tokens are all zero."""
    angle = check_float(angle, "angle", low=0, high=math.pi, strict_low=True, error=MetricError)
    Xb, batched = as_batch(X, torch.float64)
    batch = Xb.detach().to("cpu")
    if not bool(torch.isfinite(batch).all()):
        raise MetricError("X contains NaN or Inf")
    norms = torch.linalg.vector_norm(batch, dim=-1)
    valid = norms > 0
    if not bool(valid.any(-1).all()):
        raise MetricError("every token of a sample is zero: there is no direction to cluster")
    counts = components(batch / torch.where(valid, norms, 1.0).unsqueeze(-1), valid, angle)
    return counts if batched else counts[0]


def components(U: torch.Tensor, valid: torch.Tensor, angle: float) -> torch.Tensor:
    """Connected components of the link graph of unit rows ``U`` ``(B, N, d)`` over the
    tokens where ``valid`` ``(B, N)`` is True; ``(B,)`` float64."""
    from scipy.sparse.csgraph import connected_components

    linked = ((U @ U.mT >= math.cos(angle)) & valid.unsqueeze(-1) & valid.unsqueeze(-2)).cpu().numpy()
    keep = valid.cpu().numpy()
    return torch.tensor([connected_components(a[k][:, k], directed=False)[0] for a, k in zip(linked, keep)],
                        dtype=torch.float64)


__all__ = ["CLUSTER_ANGLE", "cluster_count", "components"]
