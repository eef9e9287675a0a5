"""Over-smoothing measures from the GNN literature, on the attention-mask graph.

The graph is a mask ``M`` (a :class:`rankcollapse.masks.Mask` or a bool ``(N, N)`` /
``(B, N, N)`` matrix over the padded positions, ``M[i, j]`` = token i attends to
token j, spec.md §1); without a mask, the complete graph. With padding, the graph
is restricted to the real tokens. Both measures are computed from ``(N, N)`` Gram
matrices, never from ``(N, N, d)`` differences.
"""

from __future__ import annotations

import torch

from ._context import MetricContext, evaluate


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
    """Dirichlet energy of the tokens on the mask graph.

    ``E(X) = (1/N) sum_{(i, j): M[i, j]} ||x_i - x_j||_2^2`` over the directed edges of
    the mask (a symmetric mask counts each pair twice; self-loops add 0), ``N`` the
    number of real tokens. This is the unnormalised-Laplacian energy of Rusch,
    Bronstein & Mishra, "A survey on oversmoothing in graph neural networks" (2023),
    Def. 3.1, without degree normalisation so that ``E = 0`` iff tokens joined by an
    edge are equal. Not scale-invariant: ``E(cX) = c^2 E(X)``. With the complete
    graph ``E = 2 mu(X)^2``.

    Parameters
    ----------
    X : ``(N, d)`` or ``(B, N, d)``.
    mask : Mask, bool ``(N, N)`` or ``(B, N, N)`` over padded positions; default complete.
    padding_mask, dtype : as :func:`rankcollapse.metrics.mu`.

    Raises
    ------
    MetricError
        Bad X or padding mask (see :func:`rankcollapse.metrics.mu`), or a mask that is
        not boolean or of the wrong shape.
    """
    return evaluate(X, {"e": _dirichlet_energy}, mask=mask, padding_mask=padding_mask, dtype=dtype)["e"]


def mean_average_distance(X, *, mask=None, padding_mask=None, dtype=None) -> torch.Tensor:
    """Mean average (cosine) distance, MAD, on the mask graph.

    Chen et al., "Measuring and relieving the over-smoothing problem for graph neural
    networks from the topological view", AAAI 2020, Eqs. 1–4: ``D_ij = 1 - cos(x_i,
    x_j)`` on target pairs ``M[i, j]``, ``i != j``; per token ``D_i = mean_j D_ij`` over
    its target pairs; MAD = mean of ``D_i`` over tokens that have target pairs.
    Normalisation differs from the paper in one stated way: Chen et al. divide by the
    number of *non-zero* distances, which makes exactly-equal tokens drop out (0/0
    for a collapsed set); we divide by the number of target pairs, so a fully
    collapsed set gives MAD = 0 and generic inputs agree with the paper. Zero tokens
    are left out (:class:`ZeroRowWarning`); with no target pair at all (e.g.
    ``N = 1``) MAD is 0. Range ``[0, 2]``. Parameters and errors as
    :func:`dirichlet_energy`; raises also if every token is zero.
    """
    return evaluate(X, {"m": _mean_average_distance}, mask=mask, padding_mask=padding_mask, dtype=dtype)["m"]
