"""Singular-value metrics. One ``torch.linalg.svdvals`` per call feeds all of them.

``sigma_1 >= ... >= sigma_k`` with ``k = min(N, d)`` are the singular values of the
real tokens ``X`` ``(N, d)``. Public functions take ``(N, d)`` or ``(B, N, d)`` input
plus ``padding_mask`` and ``dtype`` exactly like :func:`rankcollapse.metrics.mu`.
Metrics normalised by ``sigma_1`` raise :class:`MetricError` on the zero matrix.
"""

from __future__ import annotations

import torch

from ._context import MetricContext, RankTolerance, as_batch, check_finite, evaluate, stable_norm, svdvals_fast


def _nonzero(ctx: MetricContext, what: str) -> torch.Tensor:
    S = ctx.svals
    ctx.fail(S[..., 0] == 0, f"X is the zero matrix: {what} is undefined")
    return S


def _numerical_rank(ctx: MetricContext) -> torch.Tensor:
    S = ctx.svals
    if ctx.tolerance.atol is not None:  # absolute: compare on the input's own scale
        above = S * ctx.scale.unsqueeze(-1) > ctx.tolerance.atol
    else:
        above = S > ctx.tolerance.threshold(S, ctx.n_tokens, ctx.dim, ctx.frobenius, ctx.data_eps)
    return above.sum(dim=-1).to(S.dtype)


def _rank_fraction(ctx: MetricContext) -> torch.Tensor:
    return _numerical_rank(ctx) / min(ctx.n_tokens, ctx.dim)


def _sigma_min(ctx: MetricContext) -> torch.Tensor:
    return ctx.svals[..., -1] * ctx.scale


def _sigma_ratio(ctx: MetricContext) -> torch.Tensor:
    S = _nonzero(ctx, "sigma_2 / sigma_1")
    if S.shape[-1] < 2:  # rank <= 1 by shape: sigma_2 = 0
        return torch.zeros_like(S[..., 0])
    return S[..., 1] / S[..., 0]


def _rank_one_distance(ctx: MetricContext) -> torch.Tensor:
    return stable_norm(ctx.svals[..., 1:], -1) * ctx.scale


def _stable_rank(ctx: MetricContext) -> torch.Tensor:
    S = _nonzero(ctx, "the stable rank")
    return (S / S[..., :1]).square().sum(dim=-1)


def _effective_rank(ctx: MetricContext) -> torch.Tensor:
    S = _nonzero(ctx, "the effective rank")
    p = S / S.sum(dim=-1, keepdim=True)
    return torch.exp(-torch.special.xlogy(p, p).sum(dim=-1))


def _one(fn, name, X, padding_mask, dtype, tolerance=RankTolerance()):
    values = evaluate(X, {name: fn}, padding_mask=padding_mask, dtype=dtype, tolerance=tolerance, stacklevel=4)
    return values[name]


def singular_values(X, *, dtype=None) -> torch.Tensor:
    """Singular values ``(min(N, d),)`` or ``(B, min(N, d))``, descending.

    No padding mask: padded samples have different numbers of singular values; use
    the metrics below (which accept ``padding_mask``) for those. Raises
    :class:`MetricError` on NaN/Inf, empty input or wrong number of dimensions.
    """
    Xb, batched = as_batch(X, dtype)
    check_finite(Xb, None, batched)
    S = svdvals_fast(Xb)
    return S if batched else S[0]


def numerical_rank(X, *, padding_mask=None, dtype=None, atol=None, rtol=None, noise_floor=True) -> torch.Tensor:
    """Numerical rank ``#{k : sigma_k > tol}`` (as a float tensor).

    Default ``tol = max(sigma_1 max(N, d) eps_c, u_s ||X||_F)``: the error of the SVD
    in the compute dtype (numpy's ``matrix_rank`` rule, ``eps_c`` of the compute dtype;
    half precision is computed in float32) and, with ``noise_floor=True``, the noise
    floor of the input's storage (unit roundoff ``u_s = eps_s / 2`` of the input's
    dtype; by Weyl's inequality a singular value above ``u_s ||X||_F`` is not rounding
    alone). See :class:`rankcollapse.metrics._context.RankTolerance` and docs/metrics.md.
    ``rtol`` gives ``tol = rtol sigma_1`` and ``atol`` an absolute ``tol`` (on the
    input's scale; it takes precedence); either replaces both terms. The zero matrix
    has rank 0.
    """
    tolerance = RankTolerance(atol, rtol, noise_floor)
    return _one(_numerical_rank, "numerical_rank", X, padding_mask, dtype, tolerance)


def rank_fraction(X, *, padding_mask=None, dtype=None, atol=None, rtol=None, noise_floor=True) -> torch.Tensor:
    """Fraction of full rank ``numerical_rank(X) / min(N, d)`` in ``[0, 1]``.

    "Percentage of full rank" of Fig. 4 in Wu et al. (NeurIPS 2024); ``N`` is the
    number of real (unpadded) tokens. Tolerance as in :func:`numerical_rank`.
    """
    tolerance = RankTolerance(atol, rtol, noise_floor)
    return _one(_rank_fraction, "rank_fraction", X, padding_mask, dtype, tolerance)


def sigma_min(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Smallest singular value ``sigma_{min(N, d)}`` (Fig. 4 of Wu et al., NeurIPS 2024).

    For ``N < d`` this is the N-th singular value (the matrix has only N)."""
    return _one(_sigma_min, "sigma_min", X, padding_mask, dtype)


def sigma_ratio(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """``sigma_2 / sigma_1`` in ``[0, 1]``; 0 iff X has rank one (tokens at ``±v``,
    which ``mu`` misses; spec.md §3). 0 when ``min(N, d) = 1``. Raises
    :class:`MetricError` for the zero matrix."""
    return _one(_sigma_ratio, "sigma_ratio", X, padding_mask, dtype)


def rank_one_distance(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Frobenius distance to the nearest matrix of rank <= 1,
    ``sqrt(sum_{k >= 2} sigma_k^2)`` (Eckart–Young; spec.md §3)."""
    return _one(_rank_one_distance, "rank_one_distance", X, padding_mask, dtype)


def stable_rank(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Stable rank ``||X||_F^2 / sigma_1^2 = sum_k (sigma_k / sigma_1)^2`` in
    ``[1, min(N, d)]`` (Rudelson & Vershynin, 2007). Raises for the zero matrix."""
    return _one(_stable_rank, "stable_rank", X, padding_mask, dtype)


def effective_rank(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Effective rank ``exp(H(p))`` with ``p_k = sigma_k / sum_j sigma_j`` and Shannon
    entropy ``H(p) = -sum_k p_k log p_k`` (``0 log 0 = 0``); in ``[1, min(N, d)]``.
    Source: Roy & Vetterli, "The effective rank", EUSIPCO 2007, Def. 1. Raises for
    the zero matrix."""
    return _one(_effective_rank, "effective_rank", X, padding_mask, dtype)
