"""IsoScore (Rudman, Gillman, Rayne & Eickhoff, "IsoScore: Measuring the Uniformity
of Embedding Space Utilization", Findings of ACL 2022, Algorithm 1), from the paper's
definition on the usual ``(N, d)`` layout (points = tokens = rows).

For points in ``R^n`` (``n = d``):

1. PCA-reorient the centred points; the diagonal of their covariance is the vector
   ``lambda`` of covariance eigenvalues (zero-padded to length n when ``N - 1 < n``).
2. Normalise: ``lambda_hat = sqrt(n) lambda / ||lambda||_2`` (so ``||lambda_hat|| =
   ||1|| = sqrt(n)``).
3. Isotropy defect ``delta = ||lambda_hat - 1||_2 / sqrt(2 (n - sqrt(n)))`` in [0, 1].
4. Fraction of dimensions used ``phi = (n - delta^2 (n - sqrt(n)))^2 / n^2``.
5. ``IsoScore = (n phi - 1) / (n - 1)`` in [0, 1].

Closed form used for computation: since ``||lambda_hat||^2 = n``,
``||lambda_hat - 1||^2 = 2n - 2 sqrt(n) r`` with ``r = sum(lambda) / ||lambda||_2``, so
``delta^2 (n - sqrt(n)) = n - sqrt(n) r``, ``phi = r^2 / n`` and

    IsoScore = (PR - 1) / (n - 1),   PR = (sum lambda)^2 / sum lambda^2
                                        = tr(C)^2 / ||C||_F^2,

the participation ratio of the covariance ``C``. The PCA step drops out (IsoScore is
rotation invariant), and ``tr(C)``, ``||C||_F`` come from the centred ``(N, N)`` Gram
matrix (same non-zero eigenvalues as ``C``): no eigendecomposition is needed. Points
spread isotropically over k of the n dimensions have ``PR = k``, hence
``IsoScore = (k - 1) / (n - 1)`` exactly; N tokens in d > N dimensions score at most
``(N - 2) / (d - 1)``.

Conventions (the formula is 0/0 there): zero covariance (all tokens equal, e.g.
``N = 1``) scores 0, the least isotropic value; ``d = 1`` with non-zero variance
scores 1 (the only dimension is used).
"""

from __future__ import annotations

import torch

from ._context import MetricContext, evaluate


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
    """IsoScore of the tokens (rows of X), in ``[0, 1]``; 1 = isotropic.

    See the module docstring for the algorithm (Rudman et al. 2022, Alg. 1), the
    closed form ``(k - 1)/(n - 1)`` and the degenerate-case conventions.

    Parameters
    ----------
    X : ``(N, d)`` or ``(B, N, d)`` (rows are points, as in the PyPI IsoScore package
        2.0.1, which takes ``(num_samples, dimension)``).
    padding_mask, dtype : as :func:`rankcollapse.metrics.mu`.

    Raises
    ------
    MetricError
        As :func:`rankcollapse.metrics.mu`.
    """
    return evaluate(X, {"isoscore": _isoscore}, padding_mask=padding_mask, dtype=dtype)["isoscore"]
