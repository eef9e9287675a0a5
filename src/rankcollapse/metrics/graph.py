"""Over-smoothing measures from the GNN literature on the attention-mask graph ``M``
(``M[i, j]``: token i attends to j, spec.md §1; default complete), restricted to the real
tokens, computed from ``(N, N)`` Gram matrices.

Cluster count of token directions: connected components (single linkage) of the graph
linking tokens at an angle below ``angle``, for the metastable states that precede collapse
(Bruno et al., ICLR 2025; :mod:`rankcollapse.theory.clusters`).
"""

from __future__ import annotations

import math

import torch

from .._validate import check_float
from ..errors import MetricError
from ._context import MetricContext, as_batch, evaluate_one


def _dirichlet_energy(ctx: MetricContext) -> torch.Tensor:
    # ||x_i - x_j||^2 = g_ii + g_jj - 2 g_ij on the centred Gram (translation
    # invariant; centring keeps the cancellation small when tokens collapse).
    G = ctx.centered_gram
    W = ctx.graph
    sq = G.diagonal(dim1=-2, dim2=-1)
    degree = W.sum(dim=-1) + W.sum(dim=-2)
    total = (sq * degree).sum(dim=-1) - 2.0 * (W * G).sum(dim=(-2, -1))
    return total.clamp_min(0.0) / ctx.n_tokens * ctx.scale * ctx.scale  # E(cX) = c^2 E(X)


def _mean_average_distance(ctx: MetricContext) -> torch.Tensor:
    valid = ctx.row_valid
    target = ctx.graph * (valid.unsqueeze(-1) & valid.unsqueeze(-2))
    target = target * (1.0 - torch.eye(ctx.n_tokens, dtype=target.dtype, device=target.device))
    distance = 1.0 - ctx.cos  # the diagonal is not a target pair
    count = target.sum(dim=-1)
    row_mean = (target * distance).sum(dim=-1) / count.clamp_min(1.0)
    has_pairs = count > 0
    n_rows = has_pairs.sum(dim=-1)
    mad = (row_mean * has_pairs).sum(dim=-1) / n_rows.clamp_min(1)
    return torch.where(n_rows > 0, mad, torch.zeros_like(mad))


def dirichlet_energy(X, *, mask=None, padding_mask=None, dtype=None) -> torch.Tensor:
    """Dirichlet energy ``E(X) = (1/N) sum_{(i, j): M[i, j]} ||x_i - x_j||_2^2`` over the
    directed edges of the mask (Rusch, Bronstein & Mishra 2023, Def. 3.1, without degree
    normalisation); ``E(cX) = c^2 E(X)``, and ``E = 2 mu(X)^2`` on the complete graph.
    ``mask``: any mask form over the padded positions (default complete); otherwise as
    :func:`rankcollapse.metrics.mu`, and raises for a bad mask.
    """
    return evaluate_one(X, "dirichlet_energy", _dirichlet_energy, mask=mask, padding_mask=padding_mask, dtype=dtype)


def mean_average_distance(X, *, mask=None, padding_mask=None, dtype=None) -> torch.Tensor:
    """Mean average cosine distance, MAD (Chen et al., AAAI 2020, Eqs. 1–4), in ``[0, 2]``.

    ``D_i = mean_j (1 - cos(x_i, x_j))`` over the target pairs ``M[i, j]``, ``i != j``; MAD
    the mean of ``D_i`` over tokens with target pairs (0 with none). Divided by the number
    of target pairs, not of non-zero distances as in the paper, so a collapsed set gives 0.
    Zero tokens are left out; as :func:`dirichlet_energy`, and raises if every token is zero.
    """
    return evaluate_one(X, "mean_average_distance", _mean_average_distance, mask=mask, padding_mask=padding_mask,
                        dtype=dtype)


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
