"""Singular-value metrics ``sigma_1 >= ... >= sigma_k``, ``k = min(N, d)``, of the real tokens.

Inputs and errors as :func:`rankcollapse.metrics.mu`; metrics normalised by ``sigma_1``
raise :class:`MetricError` on the zero matrix.

IsoScore (Rudman, Gillman, Rayne & Eickhoff, Findings of ACL 2022, Algorithm 1) on the
``(N, d)`` layout (points = tokens = rows). With ``n = d`` and covariance eigenvalues ``lambda``
the algorithm reduces to (since ``||lambda_hat - 1||^2 = 2n - 2 sqrt(n) sum lambda / ||lambda||_2``)
``IsoScore = (PR - 1) / (n - 1)``, ``PR = tr(C)^2 / ||C||_F^2`` the participation ratio of
the covariance ``C``, read off the smaller of the centred Gram and ``C``. Conventions (0/0):
zero covariance scores 0; ``d = 1`` with non-zero variance scores 1.
"""

from __future__ import annotations

import torch

from ._context import MetricContext, RankTolerance, as_batch, check_finite, evaluate_one, stable_norm, svdvals_fast


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
    S = ctx.nonzero_svals("sigma_2 / sigma_1")
    if S.shape[-1] < 2:  # rank <= 1 by shape: sigma_2 = 0
        return torch.zeros_like(S[..., 0])
    return S[..., 1] / S[..., 0]


def _rank_one_distance(ctx: MetricContext) -> torch.Tensor:
    return stable_norm(ctx.svals[..., 1:], -1) * ctx.scale


def _stable_rank(ctx: MetricContext) -> torch.Tensor:
    S = ctx.nonzero_svals("the stable rank")
    return (S / S[..., :1]).square().sum(dim=-1)


def _effective_rank(ctx: MetricContext) -> torch.Tensor:
    S = ctx.nonzero_svals("the effective rank")
    p = S / S.sum(dim=-1, keepdim=True)
    return torch.exp(-torch.special.xlogy(p, p).sum(dim=-1))


def singular_values(X, *, dtype=None) -> torch.Tensor:
    """Singular values ``(min(N, d),)`` or ``(B, min(N, d))``, descending (no padding mask:
    padded samples have different numbers of them)."""
    Xb, batched = as_batch(X, dtype)
    check_finite(Xb, None, batched)
    S = svdvals_fast(Xb)
    return S if batched else S[0]


def numerical_rank(X, *, padding_mask=None, dtype=None, atol=None, rtol=None, noise_floor=True) -> torch.Tensor:
    """Numerical rank ``#{k : sigma_k > tol}`` (as a float tensor; 0 for the zero matrix).

    Default ``tol = max(sigma_1 max(N, d) eps_c, u_s ||X||_F)``, the second term with
    ``noise_floor`` (:class:`~rankcollapse.metrics._context.RankTolerance`, docs/metrics.md);
    ``rtol`` gives ``tol = rtol sigma_1`` and ``atol`` an absolute ``tol`` on the input's
    scale (it takes precedence).
    """
    return evaluate_one(X, "numerical_rank", _numerical_rank, padding_mask=padding_mask, dtype=dtype,
                        tolerance=RankTolerance(atol, rtol, noise_floor))


def rank_fraction(X, *, padding_mask=None, dtype=None, atol=None, rtol=None, noise_floor=True) -> torch.Tensor:
    """Fraction of full rank ``numerical_rank(X) / min(N, d)`` in ``[0, 1]`` (Wu et al.,
    NeurIPS 2024, Fig. 4); tolerance as :func:`numerical_rank`."""
    return evaluate_one(X, "rank_fraction", _rank_fraction, padding_mask=padding_mask, dtype=dtype,
                        tolerance=RankTolerance(atol, rtol, noise_floor))


def sigma_min(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Smallest singular value ``sigma_{min(N, d)}`` (Wu et al., NeurIPS 2024, Fig. 4)."""
    return evaluate_one(X, "sigma_min", _sigma_min, padding_mask=padding_mask, dtype=dtype)


def sigma_ratio(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """``sigma_2 / sigma_1`` in ``[0, 1]``; 0 iff X has rank one (spec.md §3)."""
    return evaluate_one(X, "sigma_ratio", _sigma_ratio, padding_mask=padding_mask, dtype=dtype)


def rank_one_distance(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Frobenius distance to the nearest matrix of rank <= 1, ``sqrt(sum_{k >= 2} sigma_k^2)``."""
    return evaluate_one(X, "rank_one_distance", _rank_one_distance, padding_mask=padding_mask, dtype=dtype)


def stable_rank(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Stable rank ``||X||_F^2 / sigma_1^2`` in ``[1, min(N, d)]`` (Rudelson & Vershynin, 2007)."""
    return evaluate_one(X, "stable_rank", _stable_rank, padding_mask=padding_mask, dtype=dtype)


def effective_rank(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Effective rank ``exp(-sum_k p_k log p_k)``, ``p_k = sigma_k / sum_j sigma_j``, in
    ``[1, min(N, d)]`` (Roy & Vetterli, EUSIPCO 2007, Def. 1)."""
    return evaluate_one(X, "effective_rank", _effective_rank, padding_mask=padding_mask, dtype=dtype)


def _participation_ratio(ctx: MetricContext) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tr C)^2 / ||C||_F^2`` of the covariance C, ``(G,)``, and whether C = 0."""
    Xc = ctx.centered
    gram = ctx.centered_gram if ctx.n_tokens <= ctx.dim else Xc.mT @ Xc  # the smaller one
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(dim=-1)
    fro_sq = gram.square().sum(dim=(-2, -1))
    degenerate = fro_sq == 0
    return trace.square() / torch.where(degenerate, 1.0, fro_sq), degenerate


def _isoscore(ctx: MetricContext) -> torch.Tensor:
    pr, degenerate = _participation_ratio(ctx)
    n = ctx.dim
    if n == 1:
        score = torch.ones_like(pr)
    else:  # PR lies in [1, rank C]; clamp only rounding
        score = ((pr - 1.0) / (n - 1)).clamp(0.0, 1.0)
    return torch.where(degenerate, torch.zeros_like(score), score)


def isoscore(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """IsoScore of the tokens (rows of X) in ``[0, 1]``, 1 = isotropic (module docstring);
    inputs and errors as :func:`rankcollapse.metrics.mu`."""
    return evaluate_one(X, "isoscore", _isoscore, padding_mask=padding_mask, dtype=dtype)
