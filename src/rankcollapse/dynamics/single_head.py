"""One single-head attention layer without MLP, on per-sample weights: the fast path of the
phase sweep, the Theorem-2 check and ``AttentionSystem``. Its update rules are
:func:`.layers.placement_update`'s (it agrees with ``simulate`` to round-off); the operation
order is fixed so that its callers' results are reproducible bit for bit.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F

from .attention import attention_weights, masked_softmax
from .config import BlockConfig
from .layer_weights import LayerWeights
from .layers import apply_norm, placement_update, qk_norm_scale
from .operators import operator_weights, parse_attention
from .sparse import BlockPlan, blocked_attention, merge_row_statistics
from ..errors import ConfigError


_NOT_RUN = ("W_O", "b_Q", "b_K", "b_V", "b_O", "rope_inv_freq", "position_bias", "W_1", "W_2")


def _check_fast(cfg: BlockConfig, weights: LayerWeights) -> None:
    if cfg.n_heads != 1 or cfg.mlp or cfg.out_proj or cfg.attention == "uniform":
        raise ConfigError("single_head_layer runs one attention head without MLP or W_O; use simulate")
    extra = [name for name in _NOT_RUN if getattr(weights, name) is not None]
    if extra or weights.n_heads != 1 or weights.n_kv_heads not in (None, 1):
        raise ConfigError(f"single_head_layer runs one head of W_Q, W_K, W_V and scale; the weights also carry "
                          f"{extra or 'several heads'}: use simulate")


def single_head_layer(X: torch.Tensor, mask: torch.Tensor, weights: LayerWeights, cfg: BlockConfig, *,
                      d_qk: float = 1.0, zero_rows: str = "keep", direct_sphere: bool = False, layer: int = 1):
    """One layer ``X(t) -> X(t+1)`` of ``X`` float ``(N, d)`` or ``(B, N, d)`` through ``mask`` bool
    ``(N, N)`` (no empty row); returns ``(X_next, A, n_zero_rows)``, ``A`` ``(N, N)`` or ``(B, N, N)``.
    ``weights``: ``W_Q, W_K`` ``(d, d_k)`` or per sample ``(B, d, d_k)``, ``W_V`` ``(d, d)`` or ``(B, d,
    d)``, and ``scale``; nothing else. ``cfg``: one head, no MLP, no ``W_O``, not uniform; any operator,
    norm, placement, ``qk_norm`` (whose ``g`` replaces ``d_qk`` and ``scale``). ``d_qk``: scores ``q k^T
    / sqrt(d_qk)``, or ``q k^T * weights.scale`` when set (the same up to one rounding: each caller keeps
    the form its recorded results used). ``zero_rows``, ``direct_sphere``: the ``sphere`` norm's options
    (:func:`.layers.sphere`); ``layer``: the 1-based index (``mix``, ``lns``).

    Raises ``ConfigError``: a ``cfg`` or weights the fast path does not run, an odd key width
    under differential attention, a zero row with ``zero_rows="raise"``; ``MaskError`` for a
    mask row with no allowed key.
    """
    _check_fast(cfg, weights)
    W_Q, W_K, W_V, scale = weights.W_Q, weights.W_K, weights.W_V, weights.scale
    g = qk_norm_scale(cfg, X.shape[-2])
    norm = partial(apply_norm, cfg=cfg, zero_rows=zero_rows, direct=direct_sphere)
    weights = []  # the layer's attention matrix

    def sa(Z):
        A = _weights(Z, mask, W_Q, W_K, cfg, d_qk=d_qk, scale=scale, qk_norm=g)
        weights.append(A)
        return _head_norm(A @ Z @ W_V, cfg)

    X, z = placement_update(X, cfg, sa, norm, layer=layer)
    return X, weights[0], z


def _weights(Z, mask, W_Q, W_K, cfg: BlockConfig, *, d_qk: float, scale: float | None, qk_norm: float | None):
    """The attention matrix of the layer on ``Z`` (the scores of :meth:`.layers.Attention.__call__`)."""
    if qk_norm is not None:  # a zero row stays 0, as in simulate
        Q, K, s = F.normalize(Z @ W_Q, dim=-1), F.normalize(Z @ W_K, dim=-1), qk_norm
    else:
        Q = K = None
        s = 1.0 / math.sqrt(d_qk) if scale is None else scale
    if cfg.attention != "softmax":
        Q, K = (Z @ W_Q, Z @ W_K) if Q is None else (Q, K)
        return operator_weights(Q, K, mask, parse_attention(cfg.attention), scale=s)
    if Q is not None:
        return masked_softmax(Q @ K.transpose(-1, -2) * s, mask)
    if scale is None:
        return attention_weights(Z, mask, W_Q, W_K, d_qk=d_qk)
    return masked_softmax((Z @ W_Q) @ (Z @ W_K).transpose(-1, -2) * scale, mask)


def single_head_layer_blocked(X: torch.Tensor, plan: BlockPlan, weights: LayerWeights, cfg: BlockConfig, *,
                              zero_rows: str = "keep", layer: int = 1):
    """:func:`single_head_layer` on the windowed kernel of :mod:`.sparse` (no ``(N, N)`` array;
    ``X`` ``(B, N, d)``, ``plan`` the mask's :class:`~.sparse.BlockPlan`, weights per sample with
    ``scale``). Returns ``(X_next, stats, n_zero_rows)``, ``stats`` the layer's
    :func:`~.sparse.merge_row_statistics` (``epsilon``, ``entropy``, ``row_mass_deficit``, each ``(B,)``).

    Raises ``ConfigError``: what :func:`single_head_layer` refuses, attention other than
    softmax, ``qk_norm``, no ``scale``.
    """
    _check_fast(cfg, weights)
    W_Q, W_K, W_V, scale = weights.W_Q, weights.W_K, weights.W_V, weights.scale
    if scale is None:
        raise ConfigError("the windowed kernel takes the score scale from the weights: set LayerWeights.scale")
    if cfg.attention != "softmax" or cfg.qk_norm:
        raise ConfigError(f"attention {cfg.attention!r} (qk_norm={cfg.qk_norm}) runs on the dense path only "
                          "(the windowed kernel computes softmax of the plain scores)")
    norm = partial(apply_norm, cfg=cfg, zero_rows=zero_rows)
    stats: dict = {}

    def sa(Z):
        parts: dict = {}
        O, _ = blocked_attention((Z @ W_Q).unsqueeze(1), (Z @ W_K).unsqueeze(1), Z.unsqueeze(1), plan, scale=scale,
                                 row_stats=parts)
        stats.update({k: v[:, 0] for k, v in merge_row_statistics(parts).items()})
        return _head_norm(O[:, 0] @ W_V, cfg)

    X, z = placement_update(X, cfg, sa, norm, layer=layer)
    return X, stats, z


def _head_norm(O: torch.Tensor, cfg: BlockConfig) -> torch.Tensor:
    """The head's output ``O`` ``(..., N, d)``, its rows divided by their RMS with ``headwise_rmsnorm``."""
    return F.rms_norm(O, (O.shape[-1],), eps=cfg.eps) if cfg.headwise_rmsnorm else O
