"""Metrics of attention probabilities ``A`` ``(N, N)``, ``(B, N, N)`` (one head) or
``(B, H, N, N)``, row ``i`` a distribution over the keys ``M[i, j]`` token ``i`` may attend.

Normalised row entropy (0 for one-hot rows: "entropy collapse", Zhai et al., ICML 2023),
participation ratio ``1 <= PR_i = 1 / sum_j A_ij^2 <= k_i`` (the effective number of keys),
and the gap counts of a row's logits (docs/phase.md, "Temperature laws").
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._validate import check_int, check_tensor_storage
from ..errors import MetricError
from ._context import _as_graph


def attention_entropy(A, mask=None, *, padding_mask=None) -> torch.Tensor:
    """Mean normalised Shannon entropy of the attention rows: ``-sum_j A_ij log A_ij / log k_i``
    over heads and rows with ``k_i >= 2`` allowed keys.

    Parameters
    ----------
    A : ``(N, N)``, ``(B, N, N)`` or ``(B, H, N, N)``, entries in ``[0, 1]``, each row
        summing to 1 over its allowed keys (computed in float64).
    mask : the allowed keys, any mask form; default the complete graph.
    padding_mask : bool ``(N,)`` or ``(B, N)``, True = real token: padded queries are
        left out and padded keys are not allowed.

    Returns float64 in ``[0, 1]``, 0-d for ``(N, N)`` input, ``(B,)`` otherwise. Raises
    :class:`MetricError` for ``A`` of a wrong shape, empty, not finite or outside ``[0, 1]``;
    mass on a key not allowed; a counted row not summing to 1 (tolerance ``sqrt(eps)`` of A's
    dtype); no row with two allowed keys; a bad mask or padding mask.
    """
    A, batched, tol = _as_heads(A)
    B, _, N, _ = A.shape
    allowed, real = _allowed(mask, padding_mask, B, N, A.device)  # (B or 1, N, N), (B or 1, N)
    outside = (A.masked_fill(allowed.unsqueeze(1), 0.0) != 0).any(-1)  # (B, H, N): mass off the allowed keys
    if bool((outside & real.unsqueeze(1)).any()):  # padded queries' rows are not read
        raise MetricError("attention puts mass on keys the mask does not allow")
    counted = (allowed.sum(-1) >= 2).expand(B, N)
    if not bool(counted.any(-1).all()):
        empty = torch.nonzero(~counted.any(-1)).flatten()[:10].tolist()
        where = f"samples {empty}" if batched else "the input"
        raise MetricError(f"no attention row of {where} has two or more allowed keys: entropy is undefined")
    if bool(((A.sum(-1) - 1).abs() > tol)[counted.unsqueeze(1).expand(A.shape[:3])].any()):
        raise MetricError(f"attention rows must sum to 1 over their allowed keys (|sum - 1| <= {tol:.1e})")
    value = row_entropy(A, allowed)
    return value if batched else value[0]


def row_mass_deficit(A, mask=None, *, padding_mask=None) -> torch.Tensor:
    """Mean row-mass deficit ``1 - sum_j A_ij`` over heads and real queries: 0 for softmax,
    positive for a sink, any sign for sigmoid or differential attention.

    Parameters
    ----------
    A : ``(N, N)``, ``(B, N, N)`` or ``(B, H, N, N)``, real and finite (no row-stochastic check).
    mask : accepted for the registry's signature; the deficit sums every key of a row.
    padding_mask : bool ``(N,)`` or ``(B, N)``, True = real token: padded queries are left out.

    Returns float64, 0-d for ``(N, N)`` input, ``(B,)`` otherwise; raises :class:`MetricError` for
    ``A`` of a wrong shape, empty, complex or not finite, or a bad padding mask.
    """
    heads, batched, _ = _as_heads(A, probabilities=False)
    B, H, N, _ = heads.shape
    _, real = _allowed(None, padding_mask, B, N, heads.device)  # (B or 1, N)
    w = real.to(torch.float64).unsqueeze(1).expand(B, H, N)  # (B, H, N)
    if not bool((w.sum(dim=(-1, -2)) > 0).all()):
        raise MetricError("a sample has no real token: its row-mass deficit is undefined")
    deficit = 1.0 - heads.sum(-1)  # (B, H, N)
    value = (deficit * w).sum(dim=(-1, -2)) / w.sum(dim=(-1, -2))
    return value if batched else value[0]


#: the summaries of :func:`participation_ratio` over heads and real queries
PR_SUMMARIES = ("mean", "median", "max", "rows")


def participation_ratio(A, mask=None, *, padding_mask=None, summary: str = "mean") -> torch.Tensor:
    """Participation ratio ``PR_i = 1 / sum_j A_ij^2`` of the attention rows.

    Parameters
    ----------
    A, mask, padding_mask : as :func:`attention_entropy` (every real query's row sums to 1).
    summary : ``"mean"``, ``"median"`` (``torch.nanmedian``'s lower middle) or ``"max"`` over
        heads and real queries, or ``"rows"`` for every row.

    Returns float64: a summary 0-d for ``(N, N)`` input, ``(B,)`` otherwise; ``"rows"`` ``(N,)``,
    ``(B, N)`` or ``(B, H, N)`` as ``A``, NaN at padded queries. Raises :class:`MetricError` as
    :func:`attention_entropy` (a sample without a real query instead of a counted row), and
    for an unknown ``summary``.
    """
    if summary not in PR_SUMMARIES:
        raise MetricError(f"summary must be one of {', '.join(PR_SUMMARIES)}, got {summary!r}")
    ndim = getattr(A, "ndim", None)
    A, batched, tol = _as_heads(A)
    B, H, N, _ = A.shape
    allowed, real = _allowed(mask, padding_mask, B, N, A.device)  # (B or 1, N, N), (B or 1, N)
    query = real.expand(B, N).unsqueeze(1).expand(B, H, N)  # (B, H, N)
    if bool((A.masked_fill(allowed.unsqueeze(1), 0.0) != 0).any(-1)[query].any()):
        raise MetricError("attention puts mass on keys the mask does not allow")
    if not bool(real.expand(B, N).any(-1).all()):
        raise MetricError("a sample has no real query: its participation ratio is undefined")
    if bool(((A.sum(-1) - 1).abs() > tol)[query].any()):
        raise MetricError(f"attention rows of real queries must sum to 1 (|sum - 1| <= {tol:.1e})")
    pr = row_participation(A).masked_fill(~query, float("nan"))  # (B, H, N)
    if summary == "rows":
        return pr.reshape(pr.shape[2:] if ndim == 2 else pr.shape[::2] if ndim == 3 else pr.shape)
    flat = pr.flatten(1)  # (B, H N)
    value = (flat.nanmean(-1) if summary == "mean" else flat.nanmedian(-1).values if summary == "median"
             else flat.nan_to_num(nan=-math.inf).amax(-1))
    return value if batched else value[0]


def row_participation(A: torch.Tensor) -> torch.Tensor:
    """``1 / sum_j A_ij^2`` over the last axis, no input checks: ``(..., N)`` -> ``(...)``."""
    return 1.0 / (A * A).sum(-1)


def gap_counting(logits, gaps, *, mask=None) -> torch.Tensor:
    """The gap-counting function ``n(g) = #{j allowed : max_k z_k - z_j <= g}`` of each row.

    Parameters
    ----------
    logits : tensor or array ``(..., M)``, real; ``-inf`` marks a key that is not allowed.
    gaps : ``(G,)`` non-negative gaps ``g``.
    mask : bool, broadcastable to ``logits``, True = key allowed; default every finite logit.

    Returns int64 ``(..., G)``, 0 for a row with no allowed key. Raises :class:`MetricError` for
    ``logits`` empty, complex, NaN or ``+inf``, bad ``gaps``, or a mask that does not broadcast.
    """
    z, allowed = _logits(logits, mask)
    g = torch.as_tensor(gaps, dtype=torch.float64).detach()
    if g.ndim != 1 or not bool(torch.isfinite(g).all()) or bool((g < 0).any()):
        raise MetricError("gaps must be a 1-D sequence of finite non-negative numbers")
    u = _gaps(z, allowed).sort(dim=-1).values  # (..., M), inf at keys not allowed
    return torch.searchsorted(u, g.expand(*u.shape[:-1], g.numel()).contiguous(), right=True)


def gap_growth(logits, *, mask=None, k_max: int = 32) -> dict[str, torch.Tensor]:
    """Least-squares fits of each row's gap count at its jumps ``(u_(k), k)``, ``u_(k)`` the
    ``k``-th smallest gap, over ``k = 2 .. min(k_max, m)`` for ``m`` allowed keys (a fixed
    number of keys near the top), ties with the maximum left out.

    Returns ``{"rate", "exponent", "r2_exp", "r2_pow"}``, float64 ``(...)`` each: the slope of
    ``ln k`` on ``u_(k)`` (``n(g) ≈ e^{a g}``), on ``ln u_(k)`` (``n(g) ≈ C g^p``) and each
    fit's R²; NaN with fewer than 3 points or constant gaps. ``logits``, ``mask`` as
    :func:`gap_counting`; ``k_max >= 4``.
    """
    check_int(k_max, "k_max", low=4, error=MetricError)
    z, allowed = _logits(logits, mask)
    u = _gaps(z, allowed).sort(dim=-1).values  # (..., M)
    m = allowed.expand(z.shape).sum(-1, keepdim=True)  # (..., 1)
    k = torch.arange(1, z.shape[-1] + 1, dtype=torch.float64)  # (M,)
    use = (k >= 2) & (k <= k_max) & (k <= m) & (u > 0) & torch.isfinite(u)
    log_k = torch.log(k).expand(u.shape)
    rate, r2_exp = _line(u, log_k, use)
    exponent, r2_pow = _line(torch.log(u.clamp(min=torch.finfo(torch.float64).tiny)), log_k, use)
    return {"rate": rate, "exponent": exponent, "r2_exp": r2_exp, "r2_pow": r2_pow}


def _logits(logits, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z float64 (..., M), allowed bool (..., M))`` of :func:`gap_counting`'s inputs."""
    z = torch.from_numpy(np.ascontiguousarray(logits)) if isinstance(logits, np.ndarray) else logits
    if not isinstance(z, torch.Tensor) or z.ndim < 1 or z.numel() == 0 or z.is_complex():
        raise MetricError("logits must be a real, non-empty torch.Tensor or numpy array (..., M)")
    z = z.detach().to(torch.float64)
    if bool(torch.isnan(z).any()) or bool((z == math.inf).any()):
        raise MetricError("logits must not be NaN or +inf (-inf marks a key that is not allowed)")
    allowed = z > -math.inf
    if mask is not None:
        try:
            allowed = allowed & torch.as_tensor(mask, dtype=torch.bool, device=z.device)
        except RuntimeError as exc:
            raise MetricError(f"mask of shape {tuple(torch.as_tensor(mask).shape)} does not broadcast to logits "
                              f"{tuple(z.shape)}") from exc
    return z, allowed.expand(z.shape)


def _gaps(z: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``max_k z_k - z_j`` over allowed keys, ``inf`` at the others (``(..., M)``)."""
    top = z.masked_fill(~allowed, -math.inf).amax(-1, keepdim=True)
    return torch.where(allowed, top - z, torch.full_like(z, math.inf))


def _line(x: torch.Tensor, y: torch.Tensor, use: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slope and R² of ``y`` on ``x`` over the points ``use`` (last axis); NaN under 3 points."""
    w = use.to(torch.float64)
    n = w.sum(-1)
    x, y = torch.where(use, x, 0.0), torch.where(use, y, 0.0)
    mx, my = (w * x).sum(-1) / n, (w * y).sum(-1) / n
    dx, dy = (x - mx.unsqueeze(-1)) * w, (y - my.unsqueeze(-1)) * w
    sxx, syy, sxy = (dx * dx).sum(-1), (dy * dy).sum(-1), (dx * dy).sum(-1)
    ok = (n >= 3) & (sxx > 0) & (syy > 0)
    nan = torch.full_like(n, math.nan)
    slope = torch.where(ok, sxy / sxx.clamp(min=1e-300), nan)
    return slope, torch.where(ok, sxy * sxy / (sxx * syy).clamp(min=1e-300), nan)


def row_entropy(A: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """:func:`attention_entropy` without input checks: ``A`` ``(..., H, N, N)``, ``allowed``
    broadcastable to ``(..., N, N)`` -> ``(...)`` in A's dtype. Entries not ``> 0`` (NaN
    included) add nothing; a sample without a counted row gives NaN. In place, one buffer."""
    plogp = A.clamp_min(torch.finfo(A.dtype).tiny).log_().mul_(A)  # a zero entry: -0, adds nothing
    if A.numel() and not bool(A.amin() >= 0):  # NaN or negative entries: set to add nothing
        plogp.masked_fill_(~(A > 0), 0.0)
    H = -plogp.sum(-1)  # (..., H, N)
    k = allowed.sum(-1).to(A.dtype).unsqueeze(-2)  # (..., 1, N)
    w = (k >= 2).to(A.dtype).expand_as(H)
    Hn = H / torch.log(k.clamp_min(2))
    return (Hn * w).sum(dim=(-1, -2)) / w.sum(dim=(-1, -2))


def _as_heads(A, *, probabilities: bool = True) -> tuple[torch.Tensor, bool, float]:
    """``(A as float64 (B, H, N, N), batched, row-sum tolerance)``: finite, in ``[0, 1]`` if ``probabilities``;
    the tolerance is ``sqrt(eps)`` of A's own dtype (``1e-6`` for exact input)."""
    if isinstance(A, np.ndarray):
        if A.dtype.kind not in "biuf":
            raise MetricError(f"attention must hold real numbers, got numpy dtype {A.dtype}")
        A = torch.from_numpy(np.ascontiguousarray(A.astype(A.dtype.newbyteorder("="))))
    if not isinstance(A, torch.Tensor):
        raise MetricError(f"attention must be a torch.Tensor or numpy array, got {type(A).__name__}")
    check_tensor_storage(A, "attention", error=MetricError)
    if A.ndim not in (2, 3, 4) or A.shape[-1] != A.shape[-2]:
        raise MetricError(f"attention must have shape (N, N), (B, N, N) or (B, H, N, N), got {tuple(A.shape)}")
    if A.numel() == 0 or A.is_complex():
        raise MetricError(f"attention must be real and non-empty, got shape {tuple(A.shape)}, dtype {A.dtype}")
    tol = math.sqrt(torch.finfo(A.dtype).eps) if A.dtype.is_floating_point else 1e-6
    A = A.detach().to(torch.float64)
    if not bool(torch.isfinite(A).all()) or probabilities and (bool((A < 0).any()) or bool((A > 1).any())):
        raise MetricError("attention probabilities must be finite and in [0, 1]" if probabilities
                          else "attention must be finite")
    heads = A if A.ndim == 4 else A.unsqueeze(1) if A.ndim == 3 else A[None, None]
    return heads, A.ndim >= 3, tol


def _allowed(mask, padding_mask, B: int, N: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(allowed, real)``: allowed keys ``(B or 1, N, N)`` (the mask, default complete,
    and with padding real queries and keys only) and real queries ``(B or 1, N)``."""
    M = _as_graph(mask, N, B, device)
    M = torch.ones(1, N, N, dtype=torch.bool, device=device) if M is None else M
    if padding_mask is None:
        return M, torch.ones(1, N, dtype=torch.bool, device=device)
    check_tensor_storage(padding_mask, "padding_mask", error=MetricError)
    pm = torch.as_tensor(padding_mask).to(device)
    if pm.dtype != torch.bool:
        pm = pm != 0
    pm = pm if pm.ndim == 2 else pm.unsqueeze(0)
    if pm.shape[-1] != N or pm.shape[0] not in (1, B) or pm.ndim != 2:
        raise MetricError(f"padding_mask must have shape ({N},) or ({B}, {N}), got {tuple(pm.shape)}")
    return M & pm.unsqueeze(-1) & pm.unsqueeze(-2), pm
