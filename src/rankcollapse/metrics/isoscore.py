"""IsoScore (Rudman, Gillman, Rayne & Eickhoff, Findings of ACL 2022, Algorithm 1) on the
``(N, d)`` layout (points = tokens = rows).

With ``n = d`` and covariance eigenvalues ``lambda`` the algorithm reduces to (since
``||lambda_hat - 1||^2 = 2n - 2 sqrt(n) sum lambda / ||lambda||_2``)
``IsoScore = (PR - 1) / (n - 1)``, ``PR = tr(C)^2 / ||C||_F^2`` the participation ratio of
the covariance ``C``, read off the smaller of the centred Gram and ``C``. Conventions (0/0):
zero covariance scores 0; ``d = 1`` with non-zero variance scores 1.
"""

from __future__ import annotations

import torch

from ._context import MetricContext, evaluate_one


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
