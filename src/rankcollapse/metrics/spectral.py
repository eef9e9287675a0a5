"""Singular-value metrics ``sigma_1 >= ... >= sigma_k``, ``k = min(N, d)``, of the real tokens.

Inputs and errors as :func:`rankcollapse.metrics.mu`; metrics normalised by ``sigma_1``
raise :class:`MetricError` on the zero matrix.

IsoScore (Rudman, Gillman, Rayne & Eickhoff, Findings of ACL 2022, Algorithm 1) on the
``(N, d)`` layout (points = tokens = rows). With ``n = d`` and covariance eigenvalues ``lambda``
the algorithm reduces to (since ``||lambda_hat - 1||^2 = 2n - 2 sqrt(n) sum lambda / ||lambda||_2``)
``IsoScore = (PR - 1) / (n - 1)``, ``PR = tr(C)^2 / ||C||_F^2`` the participation ratio of
the covariance ``C``, read off the smaller of the centred Gram and ``C``. Conventions (0/0):
zero covariance scores 0; ``d = 1`` with non-zero variance scores 1.

Geometry of trained-model token matrices, massive tokens and the shape of the spectrum: massive
activations (Sun et al. 2024) and spectral compression (Queipo-de-Llano et al., arXiv 2510.06477)
on the singular values of the real, uncentred tokens and their norms ``||x_i||``
(``sigma_1^2 >= ||x_i||^2``).

How far tokens sit from the origin (``token_radius``) and how fast they turn from one layer to the
next (``angular_speed``), the speed of clustering that normalisations regulate (Karagodin et al.,
NeurIPS 2025). The angle is ``2 asin(||u - v|| / 2)`` of the unit rows, exact near 0 and pi where
``acos`` loses half the digits.
"""

from __future__ import annotations

import torch

from ..errors import MetricError
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


def _isoscore(ctx: MetricContext) -> torch.Tensor:
    Xc = ctx.centered
    gram = ctx.centered_gram if ctx.n_tokens <= ctx.dim else Xc.mT @ Xc  # the smaller one
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(dim=-1)
    fro_sq = gram.square().sum(dim=(-2, -1))
    degenerate = fro_sq == 0  # C = 0
    pr = trace.square() / torch.where(degenerate, 1.0, fro_sq)  # (tr C)^2 / ||C||_F^2
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


def _max_norm_ratio(ctx: MetricContext) -> torch.Tensor:
    median = torch.quantile(ctx.row_norms, 0.5, dim=-1)  # numpy's: the mean of the two middle values
    ctx.fail(median == 0, "the median token norm is 0 (half the tokens or more are zero): max_norm_ratio is undefined")
    return ctx.row_norms.amax(dim=-1) / median


def _max_norm_position(ctx: MetricContext) -> torch.Tensor:
    # argmax returns the first maximal index on ties (documented by torch since 1.7)
    return ctx.row_norms.argmax(dim=-1).to(ctx.X.dtype)


def _squared_spectrum(ctx: MetricContext, what: str) -> torch.Tensor:
    """``sigma_i^2 / sigma_1^2`` ``(G, k)``; refuses the zero matrix."""
    S = ctx.nonzero_svals(what)
    return (S / S[..., :1]).square()


def _top_singular_share(ctx: MetricContext) -> torch.Tensor:
    return 1.0 / _squared_spectrum(ctx, "top_singular_share").sum(dim=-1)


def _max_token_sigma_share(ctx: MetricContext) -> torch.Tensor:
    S = ctx.nonzero_svals("max_token_sigma_share")
    return (ctx.row_norms.amax(dim=-1) / S[..., 0]).square()


def _matrix_entropy(ctx: MetricContext) -> torch.Tensor:
    rel = _squared_spectrum(ctx, "matrix_entropy")
    p = rel / rel.sum(dim=-1, keepdim=True)
    return -torch.special.xlogy(p, p).sum(dim=-1)


def _alpha_req(ctx: MetricContext) -> torch.Tensor:
    S = ctx.nonzero_svals("alpha_req")
    tol = ctx.tolerance.threshold(S, ctx.n_tokens, ctx.dim, ctx.frobenius, ctx.data_eps) \
        if ctx.tolerance.atol is None else ctx.tolerance.atol / ctx.scale.unsqueeze(-1)
    w = (S > tol).to(S.dtype)  # the fit range: i = 1..r, the numerical rank (S is descending)
    ctx.fail(w.sum(dim=-1) < 2, "alpha_req needs at least 2 singular values above the numerical-rank "
             "tolerance (X has rank <= 1): a power law through one point is undetermined")
    x = torch.log(torch.arange(1, S.shape[-1] + 1, dtype=S.dtype, device=S.device)).expand_as(S)
    y = torch.where(w > 0, 2.0 * torch.log(torch.where(w > 0, S, 1.0)), 0.0)  # log lambda_i, lambda_i = sigma_i^2
    n = w.sum(dim=-1, keepdim=True).clamp(min=1.0)
    xc = (x - (w * x).sum(dim=-1, keepdim=True) / n) * w
    yc = (y - (w * y).sum(dim=-1, keepdim=True) / n) * w
    slope = (xc * yc).sum(dim=-1) / (xc * xc).sum(dim=-1).clamp(min=torch.finfo(S.dtype).tiny)
    return -slope


def max_norm_ratio(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """``max_i ||x_i|| / median_i ||x_i||`` in ``[1, inf)``, the massive-activation statistic
    of Sun et al. (2024) on whole token norms (numpy's median); refuses a median of 0."""
    return evaluate_one(X, "max_norm_ratio", _max_norm_ratio, padding_mask=padding_mask, dtype=dtype)


def max_norm_position(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Position of the largest-norm real token (0 = the first; the first on ties), as a float."""
    return evaluate_one(X, "max_norm_position", _max_norm_position, padding_mask=padding_mask, dtype=dtype)


def top_singular_share(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """``sigma_1^2 / ||X||_F^2`` in ``[1/k, 1]``, the inverse of ``stable_rank``."""
    return evaluate_one(X, "top_singular_share", _top_singular_share, padding_mask=padding_mask, dtype=dtype)


def max_token_sigma_share(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """``max_i ||x_i||^2 / sigma_1^2`` in ``(0, 1]``: the share of the top singular value the
    largest token explains alone."""
    return evaluate_one(X, "max_token_sigma_share", _max_token_sigma_share, padding_mask=padding_mask, dtype=dtype)


def matrix_entropy(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Shannon entropy ``-sum_i p_i ln p_i`` (nats) of ``p_i = sigma_i^2 / sum_j sigma_j^2``, in
    ``[0, ln k]``: the matrix entropy of Skean et al. ("Layer by Layer", ICML 2025) at alpha = 1."""
    return evaluate_one(X, "matrix_entropy", _matrix_entropy, padding_mask=padding_mask, dtype=dtype)


def alpha_req(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """alpha-ReQ: the decay exponent alpha of ``lambda_i = sigma_i^2 ~ i^(-alpha)`` (Agrawal
    et al., NeurIPS 2022), ``-slope`` of the OLS fit of ``ln lambda_i`` on ``ln i`` over
    ``i = 1..r``, r the numerical rank (:func:`~rankcollapse.metrics.numerical_rank`). X is
    not centred (pass ``X - X.mean(-2)`` for the paper's covariance spectrum: same alpha).
    As :func:`~rankcollapse.metrics.mu`; refuses a rank <= 1 (the fit is undetermined).
    """
    return evaluate_one(X, "alpha_req", _alpha_req, padding_mask=padding_mask, dtype=dtype)


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
