"""Token-similarity metrics: μ(X), cosines and the Dong et al. (2021) residual.

Public functions take ``X`` ``(N, d)`` (result 0-d) or ``(B, N, d)`` (result ``(B,)``),
``padding_mask`` (True = real token) and ``dtype``. Cosine metrics leave zero tokens out
(:class:`ZeroRowWarning`), raise if every token is zero, and are 1 without a pair.

Over-smoothing measures from the GNN literature on the attention-mask graph ``M``
(``M[i, j]``: token i attends to j, spec.md §1; default complete), restricted to the real
tokens, computed from ``(N, N)`` Gram matrices.

Cluster count of token directions: connected components (single linkage) of the graph
linking tokens at an angle below ``angle``, for the metastable states that precede collapse
(Bruno et al., ICLR 2025; :mod:`rankcollapse.theory.clusters`).
"""

from __future__ import annotations

import math
from typing import Mapping

import torch

from .._validate import check_float
from ..errors import MetricError
from ._context import MetricContext, as_batch, evaluate_one, stable_norm


def mu_finite(X: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``mu(X) = ||X - 1 gamma_X||_F`` ``(B,)`` of finite tokens ``X`` ``(B, N, d)``, no input
    checks: the one μ computation (registry and simulator). ``out``: an ``X``-shaped buffer
    for the centred tokens."""
    mean = X.mean(dim=-2, keepdim=True)
    centred = X - mean if out is None else torch.sub(X, mean, out=out)
    return stable_norm(centred, (-2, -1))


# ---- metric functions on a context (G samples of L real tokens) -----------------
def _mu_normalised(ctx: MetricContext) -> torch.Tensor:
    return ctx.cached("mu_n", lambda: mu_finite(ctx.X))


def _mu(ctx: MetricContext) -> torch.Tensor:
    return _mu_normalised(ctx) * ctx.scale


def _mu_relative(ctx: MetricContext) -> torch.Tensor:
    ctx.fail(ctx.frobenius == 0, "X is the zero matrix: mu / ||X||_F is undefined")
    return _mu_normalised(ctx) / ctx.frobenius


def _max_token_share(ctx: MetricContext) -> torch.Tensor:
    ctx.fail(ctx.frobenius == 0, "X is the zero matrix: the token shares of ||X||_F^2 are undefined")
    return (ctx.row_norms.amax(dim=-1) / ctx.frobenius) ** 2


def _norm_spread(ctx: MetricContext) -> torch.Tensor:
    norms = ctx.row_norms
    # refused, not computed over the others: a token that underflowed to 0 caused the spread
    ctx.fail(norms.amin(dim=-1) == 0, "a token is zero: the norm spread max_i ||x_i|| / min_i ||x_i|| is infinite")
    return norms.amax(dim=-1) / norms.amin(dim=-1)


def _pair_mean(ctx: MetricContext, total: torch.Tensor) -> torch.Tensor:
    """``total`` ``(G,)`` over ordered pairs of non-zero tokens, per pair; 1 without a pair."""
    n = ctx.row_valid.sum(dim=-1).to(total.dtype)
    pairs = n * (n - 1)
    return torch.where(pairs > 0, total / pairs.clamp_min(1), torch.ones_like(total))


def _avg_abs_cos(ctx: MetricContext) -> torch.Tensor:
    return _pair_mean(ctx, ctx.abs_cos_pair_sum())


def _avg_cos(ctx: MetricContext) -> torch.Tensor:
    return _pair_mean(ctx, ctx.cos_pair_sum())


def _cos_to_mean(ctx: MetricContext) -> torch.Tensor:
    mean = ctx.mean_token
    mean_norm = stable_norm(mean, -1)
    ctx.fail(mean_norm == 0, "the mean token is zero: cosine to the mean is undefined")
    valid = ctx.row_valid
    cos = (ctx.unit_rows @ (mean / mean_norm.unsqueeze(-1)).unsqueeze(-1)).squeeze(-1)
    return cos.sum(dim=-1) / valid.sum(dim=-1)


def composite_norm(R: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Dong et al.'s composite norm ``sqrt(||R||_1 ||R||_inf)`` ``(...)`` (induced norms: largest
    absolute column and row sum) of each matrix of ``R`` ``(..., N, d)`` (ICML 2021, Sec. 2.2);
    ``out``: scratch for ``|R|``. :class:`MetricError` unless R is a tensor of 2+ dimensions."""
    if not isinstance(R, torch.Tensor) or R.ndim < 2:
        raise MetricError(f"composite_norm needs a tensor (..., N, d), got "
                          f"{f'shape {tuple(R.shape)}' if isinstance(R, torch.Tensor) else type(R).__name__}")
    A = torch.abs(R, out=out) if out is not None else R.abs()
    return torch.sqrt(A.sum(dim=-2).amax(dim=-1) * A.sum(dim=-1).amax(dim=-1))


def _composite(ctx: MetricContext, which: str) -> torch.Tensor:

    def make():
        scratch = ctx.cached("scratch", lambda: torch.empty_like(ctx.X))
        return composite_norm(ctx.centered if which == "centered" else ctx.X, out=scratch)

    return ctx.cached(f"composite_{which}", make)


def _dong_residual(ctx: MetricContext) -> torch.Tensor:
    return _composite(ctx, "centered") * ctx.scale


def _dong_residual_relative(ctx: MetricContext) -> torch.Tensor:
    ctx.fail(ctx.frobenius == 0, "X is the zero matrix: the relative residual is undefined")
    return _composite(ctx, "centered") / _composite(ctx, "X")


#: β of the registry's ``interaction_energy`` (another β: register ``partial(energy_of, beta=b)``).
ENERGY_BETA = 1.0


def energy_of(ctx: MetricContext, beta: float = ENERGY_BETA) -> torch.Tensor:
    """Interaction energy ``E_beta`` ``(G,)`` of the unit tokens (zero tokens left out), summed
    in log space so no ``exp`` overflows before ``E`` itself does."""
    U = ctx.unit_rows
    gram = U @ U.mT  # (G, L, L): <u_i, u_j>, diagonal 1
    valid = ctx.row_valid
    pairs = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    logits = torch.where(pairs, beta * gram, gram.new_tensor(-math.inf))
    log_e = torch.logsumexp(logits.flatten(-2), dim=-1) - math.log(2.0 * beta)
    ctx.fail(log_e > math.log(torch.finfo(log_e.dtype).max),
             f"E_beta at beta = {beta:g} exceeds the largest {log_e.dtype} (log E_beta = "
             f"{float(log_e.max()):.6g}): use "
             f"{'a smaller beta' if log_e.dtype == torch.float64 else 'float64 or a smaller beta'}")
    return torch.exp(log_e)


# ---- public functions -------------------------------------------------------------
def mu(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Distance to token uniformity ``mu(X) = ||X - 1 gamma_X||_F``, ``gamma_X`` the mean token.

    0 iff all tokens are equal. Source: Wu et al., NeurIPS 2024 (spec.md §3).

    Integer input is cast to the default float dtype, half precision to float32. Raises
    :class:`MetricError` for NaN/Inf in a real token, an empty, sparse or meta X, a wrong
    number of dimensions, or a bad padding mask.
    """
    return evaluate_one(X, "mu", _mu, padding_mask=padding_mask, dtype=dtype)


def mu_relative(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Scale-free token uniformity ``mu(X) / ||X||_F`` in ``[0, 1]`` (spec.md §3).

    As :func:`mu`; also raises :class:`MetricError` for the zero matrix.
    """
    return evaluate_one(X, "mu_relative", _mu_relative, padding_mask=padding_mask, dtype=dtype)


def max_token_share(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Largest share of ``||X||_F^2`` held by one token, ``max_i ||x_i||^2 / ||X||_F^2``, in
    ``[1/N, 1]`` (above :data:`DOMINANT_SHARE`, μ/‖X‖_F mostly measures that token).
    As :func:`mu_relative`.
    """
    return evaluate_one(X, "max_token_share", _max_token_share, padding_mask=padding_mask, dtype=dtype)


#: A token above this share of ‖X‖_F² holds more than all the others together: μ/‖X‖_F then
#: mostly measures it (exactly ``sqrt(1 - 1/N)`` when it is the only non-zero token).
DOMINANT_SHARE = 0.5


def dominant_token_text(share: Mapping[int, float], where: str = "", moved: str = "") -> str | None:
    """The note on a dominant token from ``share`` (layer -> mean :func:`max_token_share`,
    NaN left out), or None when no layer is above :data:`DOMINANT_SHARE`. ``where`` (e.g.
    `` in 3 of 8 windows``) follows the first layer's share; ``moved`` closes the first sentence."""
    layers = [(int(t), float(v)) for t, v in share.items() if v == v]
    over = [(t, v) for t, v in layers if v > DOMINANT_SHARE]
    if not over:
        return None
    (t, first), (t_max, top) = over[0], max(over, key=lambda tv: tv[1])
    return (f"from layer {t} on, one token holds more than half of ‖X‖_F² (largest token's share "
            f"{first:.3g} at layer {t}{where}, up to {top:.3g} at layer {t_max}; {len(over)} of {len(layers)} "
            f"layers){moved}. There μ/‖X‖_F mostly measures that token's norm (one non-zero token gives "
            "sqrt(1 − 1/N) whatever the others), not how similar the other tokens are.")


def norm_spread(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Spread of the token norms ``max_i ||x_i|| / min_i ||x_i||`` in ``[1, inf)``.

    As :func:`mu`; raises :class:`MetricError` if a real token is zero (infinite spread).
    """
    return evaluate_one(X, "norm_spread", _norm_spread, padding_mask=padding_mask, dtype=dtype)


def avg_abs_cos(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Average absolute pairwise cosine ``(1/(N(N-1))) sum_{i != j} |cos(x_i, x_j)|``
    (Wu et al., NeurIPS 2024, Fig. 4); zero tokens as in the module docstring.
    """
    return evaluate_one(X, "avg_abs_cos", _avg_abs_cos, padding_mask=padding_mask, dtype=dtype)


def avg_cos(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Average signed pairwise cosine ``(1/(N(N-1))) sum_{i != j} cos(x_i, x_j)`` (Ethayarajh
    2019); as :func:`avg_abs_cos`.
    """
    return evaluate_one(X, "avg_cos", _avg_cos, padding_mask=padding_mask, dtype=dtype)


def cos_to_mean(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Mean cosine between each non-zero token and the mean token ``gamma_X``.

    As :func:`mu`; raises :class:`MetricError` if ``gamma_X = 0`` or every token is zero.
    """
    return evaluate_one(X, "cos_to_mean", _cos_to_mean, padding_mask=padding_mask, dtype=dtype)


def dong_residual(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Dong et al. (2021) residual ``||X - 1 x^T||_{1,inf}`` with ``x = gamma_X``.

    Dong, Cordonnier & Loukas (ICML 2021, Sec. 2.2) minimise over ``x`` (non-convex, no
    closed form); the mean token is within a factor 2 of that minimum, because for every
    ``x``, ``||X - 1 gamma^T||_1 <= 2 ||X - 1 x^T||_1`` and likewise for ``||.||_inf``
    (triangle inequality with ``gamma - x = mean_i (x_i - x)``). As :func:`mu`.
    """
    return evaluate_one(X, "dong_residual", _dong_residual, padding_mask=padding_mask, dtype=dtype)


def dong_residual_relative(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """``||X - 1 gamma_X^T||_{1,inf} / ||X||_{1,inf}`` (Dong et al. 2021); refuses the zero matrix."""
    return evaluate_one(X, "dong_residual_relative", _dong_residual_relative, padding_mask=padding_mask,
                        dtype=dtype)


def interaction_energy(X, *, beta: float = ENERGY_BETA, padding_mask=None, dtype=None) -> torch.Tensor:
    """Interaction energy ``E_beta = (1 / 2 beta) sum_{i,j} exp(beta <u_i, u_j>)`` of the
    token directions ``u_i = x_i / ||x_i||`` (Geshkovski et al., "A mathematical perspective
    on Transformers", 2023), over all ordered pairs, ``i = j`` included.

    In ``[N^2 e^{-beta} / 2 beta, N^2 e^beta / 2 beta]`` (the top when every token points
    the same way); computed in log space. Zero tokens are left out (``ZeroRowWarning``).

    As :func:`mu`; ``beta > 0`` (default :data:`ENERGY_BETA`, the registry's). Raises also for
    every token zero and ``E_beta`` beyond the compute dtype's range.
    """
    beta = check_float(beta, "beta", low=0, strict_low=True, error=MetricError)
    return evaluate_one(X, "interaction_energy", lambda ctx: energy_of(ctx, beta), padding_mask=padding_mask,
                        dtype=dtype)


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
