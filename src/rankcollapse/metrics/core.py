"""Token-similarity metrics: μ(X), cosines and the Dong et al. (2021) residual.

All public functions take ``X`` of shape ``(N, d)`` (result: 0-d tensor) or
``(B, N, d)`` (result: ``(B,)``), an optional ``padding_mask`` (``(N,)`` or ``(B, N)``,
True = real token; padded rows are never part of X) and an optional ``dtype`` to
compute in (e.g. ``torch.float64``). Bad input raises
:class:`rankcollapse.errors.MetricError`.

Zero tokens and cosines: a zero row has no direction. Cosine metrics leave zero rows
out of their averages and emit a :class:`ZeroRowWarning`; if every token is zero
they raise. With fewer than two non-zero tokens (e.g. ``N = 1``) there is no pair:
``avg_abs_cos`` and ``avg_cos`` are then defined as 1, their value for a fully
collapsed set of tokens (consistent with ``mu = 0`` for ``N = 1``).
"""

from __future__ import annotations

import math
from typing import Mapping

import torch

from .._validate import check_float
from ..errors import MetricError
from ._context import MetricContext, evaluate, stable_norm


def mu_finite(X: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``mu(X) = ||X - 1 gamma_X||_F`` ``(B,)`` of finite tokens ``X`` ``(B, N, d)``, no
    input checks: the one μ computation. The registry's ``mu`` and ``mu_relative`` call
    it on a context's checked, power-of-two-normalised tokens; the simulator's layer loop
    (which has checked the tokens) calls it on the raw ones, two passes over X instead of
    the registry's six, which matters at N = 65,536 where μ is recorded after every layer.
    The normalisation only moves the exponent (exact), so both give the same value.
    ``out``: an ``X``-shaped buffer for the centred tokens (reused across layers).
    Source: Wu et al., NeurIPS 2024 (spec.md §3)."""
    mean = X.mean(dim=-2, keepdim=True)
    centred = X - mean if out is None else torch.sub(X, mean, out=out)
    return stable_norm(centred, (-2, -1))


# ---- metric functions on a context (G samples of L real tokens) -----------------
def _mu_normalised(ctx: MetricContext) -> torch.Tensor:
    """``mu`` of the normalised tokens ``ctx.X`` (``mu(X) / ctx.scale``)."""
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
    # a zero token makes the spread infinite: refused, not computed over the others (a
    # token that underflowed to 0 would otherwise shrink the spread it is the cause of)
    ctx.fail(norms.amin(dim=-1) == 0, "a token is zero: the norm spread max_i ||x_i|| / min_i ||x_i|| is infinite")
    return norms.amax(dim=-1) / norms.amin(dim=-1)


def _pair_mean(ctx: MetricContext, total: torch.Tensor) -> torch.Tensor:
    """``total`` ``(G,)`` (a sum over ordered pairs i != j of non-zero tokens) divided
    by the number of such pairs; 1 where there is no such pair."""
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
    """Dong et al.'s composite norm ``||R||_{1,inf} = sqrt(||R||_1 ||R||_inf)``.

    ``||R||_1`` is the induced 1-norm (largest absolute column sum) and ``||R||_inf``
    the induced inf-norm (largest absolute row sum) of each ``(N, d)`` matrix in
    ``R`` ``(..., N, d)``; result ``(...)``. ``out`` (shape of R) is scratch space for
    ``|R|``. Source: Dong, Cordonnier & Loukas, "Attention is not all you need: pure
    attention loses rank doubly exponentially with depth", ICML 2021, Sec. 2.2.

    Raises
    ------
    MetricError
        ``R`` is not a tensor of at least two dimensions.
    """
    if not isinstance(R, torch.Tensor) or R.ndim < 2:
        raise MetricError(f"composite_norm needs a tensor (..., N, d), got "
                          f"{f'shape {tuple(R.shape)}' if isinstance(R, torch.Tensor) else type(R).__name__}")
    A = torch.abs(R, out=out) if out is not None else R.abs()
    return torch.sqrt(A.sum(dim=-2).amax(dim=-1) * A.sum(dim=-1).amax(dim=-1))


def _composite(ctx: MetricContext, which: str) -> torch.Tensor:
    """Composite norm of ``ctx.centered`` or ``ctx.X``, sharing one scratch buffer."""

    def make():
        scratch = ctx.cached("scratch", lambda: torch.empty_like(ctx.X))
        return composite_norm(ctx.centered if which == "centered" else ctx.X, out=scratch)

    return ctx.cached(f"composite_{which}", make)


def _dong_residual(ctx: MetricContext) -> torch.Tensor:
    return _composite(ctx, "centered") * ctx.scale


def _dong_residual_relative(ctx: MetricContext) -> torch.Tensor:
    ctx.fail(ctx.frobenius == 0, "X is the zero matrix: the relative residual is undefined")
    return _composite(ctx, "centered") / _composite(ctx, "X")


#: β of the registry's ``interaction_energy`` (another β: register
#: ``partial(energy_of, beta=b)`` under a name of its own, :func:`~.registry.register_metric`).
ENERGY_BETA = 1.0


def energy_of(ctx: MetricContext, beta: float = ENERGY_BETA) -> torch.Tensor:
    """Interaction energy ``E_beta`` ``(G,)`` of the unit tokens of ``ctx`` (zero tokens
    left out), summed in log space: ``log E = logsumexp_{i,j}(beta <u_i, u_j>) -
    log(2 beta)``, so no ``exp`` overflows before ``E`` itself leaves the dtype's range."""
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


def _interaction_energy(ctx: MetricContext) -> torch.Tensor:
    return energy_of(ctx)


# ---- public functions -------------------------------------------------------------
def _one(fn, name, X, padding_mask, dtype):
    return evaluate(X, {name: fn}, padding_mask=padding_mask, dtype=dtype, stacklevel=4)[name]


def mu(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Distance to token uniformity ``mu(X) = ||X - 1 gamma_X||_F``.

    ``gamma_X = (1/N) 1^T X`` is the mean token; ``mu = 0`` iff all tokens are equal
    (``mu = 0`` for ``N = 1``). Source: Wu et al., NeurIPS 2024, "On the Role of
    Attention Masks and LayerNorm in Transformers" (spec.md §3).

    Parameters
    ----------
    X : tensor or array ``(N, d)`` or ``(B, N, d)``, real; integer input is cast to
        the default float dtype, half precision to float32.
    padding_mask : bool ``(N,)`` / ``(B, N)``, True = real token; optional.
    dtype : torch dtype to compute in, e.g. ``torch.float64``; optional.

    Returns
    -------
    torch.Tensor : 0-d for ``(N, d)`` input, ``(B,)`` for a batch.

    Raises
    ------
    MetricError
        NaN/Inf in a real token, empty X, wrong number of dimensions, a sparse X or
        one on the meta device (no dense values), a padding mask of the wrong shape or
        one that removes every token of a sample.
    """
    return _one(_mu, "mu", X, padding_mask, dtype)


def mu_relative(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Scale-free token uniformity ``mu(X) / ||X||_F`` in ``[0, 1]``.

    Pure attention can shrink or grow norms, so the ratio separates collapse from
    scale (spec.md §3). Same parameters and errors as :func:`mu`; also raises
    :class:`MetricError` if X is the zero matrix.
    """
    return _one(_mu_relative, "mu_relative", X, padding_mask, dtype)


def max_token_share(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Largest share of ``||X||_F^2`` held by one token, ``max_i ||x_i||^2 / ||X||_F^2``,
    in ``[1/N, 1]``: ``1/N`` when every token has the same norm, near 1 when one token's
    norm dwarfs the others' (a massive activation). Above 1/2, μ(X)/‖X‖_F mostly measures
    that one token: with ``X = e_k x_k^T`` exactly, ``mu/||X||_F = sqrt(1 - 1/N)``
    whatever the other tokens were. Same parameters and errors as :func:`mu_relative`.
    """
    return _one(_max_token_share, "max_token_share", X, padding_mask, dtype)


#: A token holding more than this share of ‖X‖_F² (:func:`max_token_share`) holds more
#: than all the others together: μ/‖X‖_F then mostly measures that one token (exactly
#: ``sqrt(1 - 1/N)`` when it is the only non-zero token, whatever the others).
DOMINANT_SHARE = 0.5


def dominant_token_text(share: Mapping[int, float], where: str = "", moved: str = "") -> str | None:
    """The note on a dominant token, from ``share`` (mean :func:`max_token_share` per
    layer, e.g. a ``pandas.Series`` indexed by layer; NaN left out): from the first layer
    above :data:`DOMINANT_SHARE` on, one token holds more than half of ‖X‖_F², so μ/‖X‖_F
    mostly measures that token. ``where`` (e.g. `` in 3 of 8 windows``) follows the first
    layer's share, ``moved`` (how μ/‖X‖_F and μ moved at that layer) closes the first
    sentence. None when no layer is above. ``reproduce``, ``simulate`` and ``phase`` say it."""
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
    """Spread of the token norms ``max_i ||x_i|| / min_i ||x_i||``, in ``[1, inf)``: 1 when
    every token has the same norm. Attention whose rows do not sum to 1 (a sink, sigmoid
    attention; :mod:`rankcollapse.dynamics.operators`) scales token ``i`` by its row mass,
    so tokens can align (``avg_abs_cos`` near 1) while their norms spread and
    ``mu/||X||_F`` stays away from 0. Same parameters as :func:`mu`; raises
    :class:`MetricError` if a (non-padded) token is zero: the spread is then infinite
    (in float32 a token of a sink run can underflow to 0: use float64).
    """
    return _one(_norm_spread, "norm_spread", X, padding_mask, dtype)


def avg_abs_cos(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Average absolute pairwise cosine ``(1/(N(N-1))) sum_{i != j} |cos(x_i, x_j)|``.

    Anisotropy measure of Fig. 4 in Wu et al. (NeurIPS 2024). Zero tokens are left
    out (``N`` counts non-zero tokens) with a :class:`ZeroRowWarning`; with fewer
    than two non-zero tokens the value is 1 (the fully collapsed value). Same
    parameters as :func:`mu`; raises :class:`MetricError` if every token is zero.
    """
    return _one(_avg_abs_cos, "avg_abs_cos", X, padding_mask, dtype)


def avg_cos(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Average signed pairwise cosine ``(1/(N(N-1))) sum_{i != j} cos(x_i, x_j)``.

    Unlike :func:`avg_abs_cos` it tells tokens at ``+v`` from tokens at ``±v``
    (Ethayarajh 2019 uses this as "self-similarity"/anisotropy). Same conventions and
    errors as :func:`avg_abs_cos`.
    """
    return _one(_avg_cos, "avg_cos", X, padding_mask, dtype)


def cos_to_mean(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Mean cosine between each non-zero token and the mean token ``gamma_X``.

    ``(1/|V|) sum_{i in V} cos(x_i, gamma_X)`` over the non-zero tokens ``V``;
    ``gamma_X`` averages all real tokens. Equals 1 iff all tokens point along the
    mean. Raises :class:`MetricError` if ``gamma_X = 0`` (no direction) or every token
    is zero; otherwise as :func:`mu`.
    """
    return _one(_cos_to_mean, "cos_to_mean", X, padding_mask, dtype)


def dong_residual(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """Dong et al. (2021) residual ``||X - 1 x^T||_{1,inf}`` with ``x = gamma_X``.

    Dong, Cordonnier & Loukas (ICML 2021, Sec. 2.2) define ``res(X) = X - 1 x^T``
    with ``x`` minimising the composite norm ``sqrt(||R||_1 ||R||_inf)`` (see
    :func:`composite_norm`). That minimisation is non-convex (a product of two
    polyhedral norms) and has no closed form, so we take ``x`` = the mean token
    ``gamma_X``: it is unique, shift-equivariant, zero residual iff ``mu = 0``, and
    provably within a factor 2 of the true minimum, because for every ``x``,
    ``||X - 1 gamma^T||_1 <= 2 ||X - 1 x^T||_1`` and likewise for ``||.||_inf``
    (triangle inequality with ``gamma - x = mean_i (x_i - x)``). Same parameters and
    errors as :func:`mu`.
    """
    return _one(_dong_residual, "dong_residual", X, padding_mask, dtype)


def dong_residual_relative(X, *, padding_mask=None, dtype=None) -> torch.Tensor:
    """``||X - 1 gamma_X^T||_{1,inf} / ||X||_{1,inf}``, the relative residual Dong et al.
    (2021) plot against depth. Raises :class:`MetricError` for the zero matrix."""
    return _one(_dong_residual_relative, "dong_residual_relative", X, padding_mask, dtype)


def interaction_energy(X, *, beta: float = ENERGY_BETA, padding_mask=None, dtype=None) -> torch.Tensor:
    """Interaction energy of the token directions,
    ``E_beta = (1 / 2 beta) sum_{i,j} exp(beta <u_i, u_j>)``, ``u_i = x_i / ||x_i||``.

    The interaction energy of Geshkovski, Letrouit, Polyanskiy & Rigollet ("A mathematical
    perspective on Transformers", 2023): with ``V = I`` and attention left unnormalised,
    the attention dynamics of tokens on the sphere are its gradient ascent, so it grows
    along them. Here of the normalised tokens; the sum runs over all ordered pairs, ``i = j`` included. It lies in
    ``[N^2 e^{-beta} / 2 beta, N^2 e^beta / 2 beta]``: ``N^2 e^beta / 2 beta`` when every
    token points the same way, ``(N e^beta + N (N - 1)) / 2 beta`` for orthonormal tokens.
    Computed in log space (``logsumexp``), so no term overflows on its way, and returned
    as ``E_beta`` itself: at ``beta = 1`` it stays below ``N^2 e / 2``, finite in float32
    up to ``N ~ 10^19``; where ``E_beta`` itself exceeds the dtype's largest number the
    metric is undefined (an error naming ``log E_beta``). Zero tokens have no
    direction and are left out (``N`` counts non-zero tokens), with a ``ZeroRowWarning``.

    Parameters
    ----------
    X : tensor or array ``(N, d)`` or ``(B, N, d)``, real.
    beta : inverse temperature ``beta > 0`` (default :data:`ENERGY_BETA` = 1, the
        registry's ``interaction_energy``).
    padding_mask, dtype : as :func:`mu`.

    Raises
    ------
    MetricError
        ``beta`` not a finite number > 0; every token zero; ``E_beta`` beyond the
        compute dtype's range; otherwise as :func:`mu`.
    """
    beta = check_float(beta, "beta", low=0, strict_low=True, error=MetricError)
    return _one(lambda ctx: energy_of(ctx, beta), "interaction_energy", X, padding_mask, dtype)
