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

Closed form: points spread isotropically over k of the n dimensions (k equal
eigenvalues, the rest 0) give ``||lambda_hat - 1||^2 = 2n - 2 sqrt(nk)``, hence
``delta^2 = (n - sqrt(nk)) / (n - sqrt(n))``, ``phi = k / n`` and
``IsoScore = (k - 1) / (n - 1)`` exactly. So N tokens in d > N dimensions score at
most ``(N - 2) / (d - 1)``.

Conventions (the formula is 0/0 there): zero covariance (all tokens equal, e.g.
``N = 1``) scores 0, the least isotropic value; ``d = 1`` with non-zero variance
scores 1 (the only dimension is used).
"""

from __future__ import annotations

import math

import torch

from ._context import MetricContext, evaluate


def _covariance_spectrum(ctx: MetricContext) -> torch.Tensor:
    """Eigenvalues ``(G, d)`` of ``Xc^T Xc`` (the covariance up to a scale IsoScore
    ignores), from the smaller of the two Gram matrices; zero-padded to d."""
    Xc = ctx.centered
    if ctx.n_tokens < ctx.dim:
        lam = torch.linalg.eigvalsh(ctx.centered_gram)
        lam = torch.nn.functional.pad(lam, (0, ctx.dim - ctx.n_tokens))
    else:
        lam = torch.linalg.eigvalsh(Xc.mT @ Xc)
    return lam.clamp_min(0.0)


def _isoscore(ctx: MetricContext) -> torch.Tensor:
    lam = _covariance_spectrum(ctx)
    n = ctx.dim
    norm = torch.linalg.vector_norm(lam, dim=-1, keepdim=True)
    degenerate = norm.squeeze(-1) == 0
    if n == 1:
        return torch.where(degenerate, 0.0, 1.0).to(lam.dtype)
    lam_hat = math.sqrt(n) * lam / norm.clamp_min(torch.finfo(lam.dtype).tiny)
    slack = n - math.sqrt(n)
    defect_sq = (lam_hat - 1.0).square().sum(dim=-1) / (2.0 * slack)
    phi = (n - defect_sq * slack).square() / n**2
    score = ((n * phi - 1.0) / (n - 1)).clamp(0.0, 1.0)
    return torch.where(degenerate, torch.zeros_like(score), score)


def isoscore(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """IsoScore of the tokens (rows of X), in ``[0, 1]``; 1 = isotropic.

    See the module docstring for the algorithm (Rudman et al. 2022, Alg. 1), the
    closed form ``(k - 1)/(n - 1)`` and the degenerate-case conventions.

    Parameters
    ----------
    X : ``(N, d)`` or ``(B, N, d)`` (rows are points; not the ``(d, N)`` layout of the
        public IsoScore package).
    padding_mask, dtype : as :func:`rankcollapse.metrics.mu`.

    Raises
    ------
    MetricError
        As :func:`rankcollapse.metrics.mu`.
    """
    return evaluate(X, {"isoscore": _isoscore}, padding_mask=padding_mask, dtype=dtype)["isoscore"]
