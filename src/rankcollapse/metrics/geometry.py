"""Geometry of trained-model token matrices: massive tokens and the shape of the spectrum.

Trained language models put one token (usually the first) at a norm tens to thousands of
times the others' ("massive activations", Sun et al., "Massive Activations in Large
Language Models", 2024); the top singular direction then is that token, and the
spectrum's entropy drops ("compression", Queipo-de-Llano et al., arXiv 2510.06477).
These metrics measure each part of that picture on ``(N, d)`` / ``(B, N, d)`` token
matrices, batched and padding-aware like every metric of the registry (see
:mod:`rankcollapse.metrics._context`).

``sigma_1 >= ... >= sigma_k``, ``k = min(N, d)``, are the singular values of the real
tokens X (not centred, the same spectrum as ``stable_rank``); ``||x_i||`` are the token
(row) norms. Elementary bound used below: ``sigma_1^2 = max_{|u|=1} ||X^T u||^2 >=
||X^T e_i||^2 = ||x_i||^2`` for every token i, so ``max_i ||x_i||^2 / sigma_1^2 <= 1``.
"""

from __future__ import annotations

import torch

from ._context import MetricContext, evaluate


def _median_norm(ctx: MetricContext) -> torch.Tensor:
    """Median token norm ``(G,)``, numpy's convention (mean of the two middle values for
    an even number of tokens)."""
    return ctx.cached("median_norm", lambda: torch.quantile(ctx.row_norms, 0.5, dim=-1))


def _max_norm_ratio(ctx: MetricContext) -> torch.Tensor:
    median = _median_norm(ctx)
    ctx.fail(median == 0, "the median token norm is 0 (half the tokens or more are zero): max_norm_ratio is undefined")
    return ctx.row_norms.amax(dim=-1) / torch.where(median == 0, 1.0, median)


def _max_norm_position(ctx: MetricContext) -> torch.Tensor:
    # argmax returns the first maximal index on ties (documented by torch since 1.7)
    return ctx.row_norms.argmax(dim=-1).to(ctx.X.dtype)


def _squared_spectrum(ctx: MetricContext, what: str) -> torch.Tensor:
    """``sigma_i^2 / sigma_1^2`` ``(G, k)``; refuses the zero matrix."""
    S = ctx.svals
    ctx.fail(S[..., 0] == 0, f"X is the zero matrix: {what} is undefined")
    top = torch.where(S[..., :1] == 0, 1.0, S[..., :1])
    return (S / top).square()


def _top_singular_share(ctx: MetricContext) -> torch.Tensor:
    rel = _squared_spectrum(ctx, "top_singular_share")
    return 1.0 / rel.sum(dim=-1)


def _max_token_sigma_share(ctx: MetricContext) -> torch.Tensor:
    S = ctx.svals
    ctx.fail(S[..., 0] == 0, "X is the zero matrix: max_token_sigma_share is undefined")
    top = torch.where(S[..., 0] == 0, 1.0, S[..., 0])
    return (ctx.row_norms.amax(dim=-1) / top).square()


def _matrix_entropy(ctx: MetricContext) -> torch.Tensor:
    rel = _squared_spectrum(ctx, "matrix_entropy")
    p = rel / rel.sum(dim=-1, keepdim=True)
    return -torch.special.xlogy(p, p).sum(dim=-1)


def _alpha_req(ctx: MetricContext) -> torch.Tensor:
    S = ctx.svals
    ctx.fail(S[..., 0] == 0, "X is the zero matrix: alpha_req is undefined")
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
    """``max_i ||x_i|| / median_i ||x_i||``, in ``[1, inf)``; 1 when all token norms are
    equal. The massive-activation statistic of Sun et al. (2024), who call a token
    massive when its largest entry is ~1000x the median; here on whole token norms.

    Parameters
    ----------
    X : ``(N, d)`` or ``(B, N, d)``; padding_mask, dtype as :func:`rankcollapse.metrics.mu`.

    Returns
    -------
    torch.Tensor, 0-d or ``(B,)``, in the compute dtype. The median is numpy's (mean of
    the two middle norms when N is even).

    Raises
    ------
    MetricError
        As :func:`~rankcollapse.metrics.mu`; the median token norm is 0.
    """
    return evaluate(X, {"max_norm_ratio": _max_norm_ratio}, padding_mask=padding_mask, dtype=dtype)["max_norm_ratio"]


def max_norm_position(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Position of the largest-norm token among the real tokens (0 = the first real
    token; the first such position on ties), as a float ``(B,)`` or 0-d tensor. Its mean
    over windows at 0 says the massive token is the first token in every window."""
    return evaluate(X, {"max_norm_position": _max_norm_position}, padding_mask=padding_mask,
                    dtype=dtype)["max_norm_position"]


def top_singular_share(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """``sigma_1^2 / ||X||_F^2 = sigma_1^2 / sum_i sigma_i^2`` in ``[1/k, 1]``: the
    energy share of the top singular direction (the inverse of ``stable_rank``).
    Raises :class:`MetricError` for the zero matrix."""
    return evaluate(X, {"top_singular_share": _top_singular_share}, padding_mask=padding_mask,
                    dtype=dtype)["top_singular_share"]


def max_token_sigma_share(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """``max_i ||x_i||^2 / sigma_1^2`` in ``(0, 1]`` (``sigma_1^2 >= ||x_i||^2``, module
    docstring): how much of the top singular value the largest token explains alone.
    Near 1 with a large ``max_norm_ratio``: the top direction *is* the massive token.
    Raises :class:`MetricError` for the zero matrix."""
    return evaluate(X, {"max_token_sigma_share": _max_token_sigma_share}, padding_mask=padding_mask,
                    dtype=dtype)["max_token_sigma_share"]


def matrix_entropy(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Rényi-1 (Shannon) entropy of the normalised squared spectrum, in nats:
    ``H = -sum_i p_i ln p_i`` with ``p_i = sigma_i^2 / sum_j sigma_j^2`` (``0 ln 0 = 0``);
    in ``[0, ln k]``: 0 for rank one, ``ln k`` for k equal singular values. ``p`` is
    the spectrum of the trace-normalised Gram ``X X^T / tr(X X^T)``, the matrix
    entropy of Skean et al. ("Layer by Layer", ICML 2025) at alpha = 1; note that
    ``effective_rank`` uses ``sigma_i`` unsquared. Raises :class:`MetricError` for the
    zero matrix."""
    return evaluate(X, {"matrix_entropy": _matrix_entropy}, padding_mask=padding_mask, dtype=dtype)["matrix_entropy"]


def alpha_req(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """alpha-ReQ: the power-law decay exponent alpha of the eigenspectrum,
    ``lambda_i ~ i^(-alpha)`` (Agrawal et al., "alpha-ReQ: Assessing Representation
    Quality in Self-Supervised Learning by measuring eigenspectrum decay", NeurIPS 2022).

    Exact fit: ordinary least squares of ``ln lambda_i`` on ``ln i`` with intercept,
    ``lambda_i = sigma_i^2`` (the eigenvalues of ``X^T X``), over the index range
    ``i = 1..r``, r the numerical rank (the singular values above the tolerance of
    :func:`~rankcollapse.metrics.numerical_rank`: the rest are rounding, whose log
    would dominate the fit); ``alpha = -slope``. So ``sigma_i = c i^(-a/2)`` gives
    ``alpha = a`` exactly, and alpha is twice the slope of ``ln sigma_i``. Differences
    from the paper, stated: X is not centred (the spectrum every other spectral metric
    here sees; pass ``X - X.mean(-2)`` for the paper's covariance spectrum, whose
    eigenvalues are ``sigma_i^2 / (N - 1)``: the same alpha) and every index up to r is
    fitted (no tail range).

    Raises
    ------
    MetricError
        As :func:`~rankcollapse.metrics.mu`; fewer than 2 singular values above the
        tolerance (rank <= 1, e.g. N = 1 or identical tokens): the fit is undetermined.
    """
    return evaluate(X, {"alpha_req": _alpha_req}, padding_mask=padding_mask, dtype=dtype)["alpha_req"]
