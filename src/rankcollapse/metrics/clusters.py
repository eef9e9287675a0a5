"""Cluster count of token directions: how many groups the tokens form on the sphere.

Two tokens are linked when the angle between them is below ``angle``; a cluster is a
connected component of that graph (single linkage), so a chain of close tokens is one
cluster. Used for the metastable multi-cluster states that precede collapse (Bruno et al.,
ICLR 2025; :mod:`rankcollapse.theory.clusters`).
"""

from __future__ import annotations

import math

import torch

from .._validate import check_float
from ..errors import MetricError
from ._context import as_batch

#: Default link angle in radians (about 5.7 degrees): tight enough that the clusters of a
#: metastable state on the circle (at least 2 pi / k apart) never merge, wide enough that a
#: cluster's own spread (which shrinks exponentially in time) links up within a few layers.
CLUSTER_ANGLE = 0.1


def cluster_count(X, *, angle: float = CLUSTER_ANGLE) -> torch.Tensor:
    """Number of clusters of the token directions.

    Parameters
    ----------
    X : ``(N, d)`` or ``(B, N, d)`` real tensor or array; zero tokens have no direction
        and are left out (as for the cosines).
    angle : link threshold in radians, in ``(0, pi]``: tokens ``i, j`` are linked when
        ``cos(x_i, x_j) >= cos(angle)``; clusters are the connected components
        (``scipy.sparse.csgraph.connected_components``).

    Returns
    -------
    torch.Tensor
        float64, 0-d for ``(N, d)``, ``(B,)`` otherwise, integer values in ``[1, N]``.

    Raises
    ------
    MetricError
        Wrong shape, ``angle`` outside ``(0, pi]``, non-finite values, or a sample whose
        tokens are all zero.
    """
    angle = check_float(angle, "angle", low=0, high=math.pi, strict_low=True, error=MetricError)
    Xb, batched = as_batch(X, torch.float64)  # a tensor or array of real numbers, else MetricError
    T = (Xb if batched else Xb[0]).detach().to("cpu")
    if T.ndim not in (2, 3) or T.shape[-2] < 1 or T.shape[-1] < 1:
        raise MetricError(f"X must have shape (N, d) or (B, N, d), got {tuple(T.shape)}")
    batch = T if T.ndim == 3 else T.unsqueeze(0)
    if not bool(torch.isfinite(batch).all()):
        raise MetricError("X contains NaN or Inf")
    norms = torch.linalg.vector_norm(batch, dim=-1)
    valid = norms > 0
    if not bool(valid.any(-1).all()):
        raise MetricError("every token of a sample is zero: there is no direction to cluster")
    counts = components(batch / torch.where(valid, norms, 1.0).unsqueeze(-1), valid, angle)
    return counts if T.ndim == 3 else counts[0]


def components(U: torch.Tensor, valid: torch.Tensor, angle: float) -> torch.Tensor:
    """Connected components of the link graph of unit rows ``U`` ``(B, N, d)`` over the
    tokens where ``valid`` ``(B, N)`` is True; ``(B,)`` float64."""
    from scipy.sparse.csgraph import connected_components

    linked = ((U @ U.mT >= math.cos(angle)) & valid.unsqueeze(-1) & valid.unsqueeze(-2)).cpu().numpy()
    keep = valid.cpu().numpy()
    return torch.tensor([connected_components(a[k][:, k], directed=False)[0] for a, k in zip(linked, keep)],
                        dtype=torch.float64)


__all__ = ["CLUSTER_ANGLE", "cluster_count", "components"]
