"""One single-head attention layer without MLP, on per-sample weights: the fast path.

:func:`rankcollapse.dynamics.simulate` runs a layer through :func:`.layers.block_forward`
(heads, ``W_O``, MLP, windowed and flex kernels, one set of weights per layer for the
whole batch). The settings of the theorems and of the phase sweep need less and one thing
more: one head, no MLP, dense mask, and weights that may differ per sample ``b`` (one
batch runs many weight draws). :func:`single_head_layer` is that layer, a handful of
batched matmuls, with the update rules of :class:`~.config.BlockConfig` (every norm,
placement, ``qk_norm`` and ``headwise_rmsnorm``), applied by the one function that applies them in ``simulate``
too, :func:`.layers.placement_update`; for example

- ``placement="none"``: ``X <- norm(A X W_V)``;
- ``post_ln``: ``X <- norm(alpha X + A X W_V)``;
- ``pre_ln``: ``X <- alpha X + A' Z W_V`` with ``Z = norm(X)`` and ``A'`` computed from ``Z``;

with ``A = softmax_G(X W_Q (X W_K)^T / sqrt(d_qk))`` (with ``qk_norm``: ``softmax_G(g q^ k^T)``
of unit query and key rows). It agrees with ``simulate`` to round-off
(``tests/phase/test_phase_regime.py::test_batched_path_matches_simulate_per_cell`` and
``tests/dynamics/test_dynamics_single_head.py`` check every norm and placement); the operation order is fixed so that the
results of its callers (phase sweep, Theorem-2 check, :class:`~rankcollapse.theory.system.AttentionSystem`)
are reproducible bit for bit. A zero row under ``sphere`` follows the one rule of
:func:`.layers.sphere`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .attention import attention_weights, masked_softmax
from .config import BlockConfig
from .layer_weights import LayerWeights
from .layers import apply_norm, placement_update, qk_norm_scale, sphere
from .operators import operator_weights, parse_attention
from .sparse import BlockPlan, blocked_attention, merge_row_statistics
from ..errors import ConfigError


#: Parts of :class:`LayerWeights` the fast path does not run (refused, not ignored).
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
    """One layer ``X(t) -> X(t+1)`` (module docstring); returns ``(X_next, A, n_zero_rows)``.

    Parameters
    ----------
    X : float ``(N, d)`` or ``(B, N, d)``.
    mask : bool ``(N, N)``, ``mask[i, j]`` = token i attends to token j; no empty row.
    weights : :class:`~.weights.LayerWeights` with ``W_Q, W_K`` ``(d, d_k)`` or per sample
        ``(B, d, d_k)``, ``W_V`` ``(d, d)`` or ``(B, d, d)`` (row-vector convention ``x -> x W``)
        and ``scale``; nothing else (no biases, ``W_O``, RoPE, position bias or MLP).
    cfg : :class:`BlockConfig` with ``n_heads=1``, ``mlp=False``; softmax attention or an
        operator of :mod:`.operators` (sink, off-by-one, sigmoid, differential), not uniform;
        any norm, placement and ``qk_norm`` (``qk_norm``'s scale ``g`` replaces ``d_qk``
        and ``scale``).
    d_qk : the temperature: scores ``q k^T / sqrt(d_qk)``
        (:func:`~.attention.attention_weights`), or ``q k^T * weights.scale`` when the
        weights set ``scale`` (``scale = 1/sqrt(d_qk)``). The two are the same number up to
        one rounding; each caller keeps the form its recorded results were computed with.
    zero_rows, direct_sphere : what a ``sphere`` norm does with a zero row, and its
        arithmetic (:func:`.layers.sphere`).
    layer : the 1-based index ``l`` of this layer (``mix`` and ``lns`` depend on it).

    Returns
    -------
    X_next : like ``X``; A : ``(N, N)`` or ``(B, N, N)`` attention of this layer;
    n_zero_rows : 0-d int64 tensor, zero rows met by a ``sphere`` norm.

    Raises
    ------
    ConfigError
        ``cfg`` with several heads, an MLP, uniform attention or ``W_O``; weights with parts
        other than ``W_Q, W_K, W_V, scale``; an odd key width under differential attention;
        a zero row with ``zero_rows="raise"``.
    MaskError
        A mask row with no allowed key.
    """
    _check_fast(cfg, weights)
    W_Q, W_K, W_V, scale = weights.W_Q, weights.W_K, weights.W_V, weights.scale
    g = qk_norm_scale(cfg, X.shape[-2])
    norm = lambda Y: _norm(Y, cfg, zero_rows, direct_sphere)  # noqa: E731
    weights = []  # the layer's one attention matrix, kept for the caller

    def sa(Z):
        A = _weights(Z, mask, W_Q, W_K, cfg, d_qk=d_qk, scale=scale, qk_norm=g)
        weights.append(A)
        return _head_norm(A @ Z @ W_V, cfg)

    X, z = placement_update(X, cfg, sa, norm, layer=layer)
    return X, weights[0], z


def _weights(Z, mask, W_Q, W_K, cfg: BlockConfig, *, d_qk: float, scale: float | None, qk_norm: float | None):
    """The attention matrix of the layer on ``Z``: softmax or ``cfg``'s operator of the scores
    ``q k^T / sqrt(d_qk)`` (``q k^T * scale``), or with ``qk_norm = g`` of ``g q^ k^T`` with
    unit query and key rows (:meth:`.layers.Attention.__call__`'s rule)."""
    if qk_norm is not None:  # a zero row stays 0, as in simulate
        Q, K, s = F.normalize(Z @ W_Q, dim=-1), F.normalize(Z @ W_K, dim=-1), qk_norm
    else:
        Q = K = None
        s = 1.0 / math.sqrt(d_qk) if scale is None else scale
    if cfg.attention != "softmax":  # sink, sigmoid, differential (dynamics.operators): rows need not sum to 1
        Q, K = (Z @ W_Q, Z @ W_K) if Q is None else (Q, K)
        return operator_weights(Q, K, mask, parse_attention(cfg.attention), scale=s)
    if Q is not None:
        return masked_softmax(Q @ K.transpose(-1, -2) * s, mask)
    if scale is None:
        return attention_weights(Z, mask, W_Q, W_K, d_qk=d_qk)
    return masked_softmax((Z @ W_Q) @ (Z @ W_K).transpose(-1, -2) * scale, mask)


def single_head_layer_blocked(X: torch.Tensor, plan: BlockPlan, weights: LayerWeights, cfg: BlockConfig, *,
                              zero_rows: str = "keep", layer: int = 1):
    """:func:`single_head_layer` on the windowed kernel of :mod:`.sparse` (the one
    :func:`~rankcollapse.dynamics.simulate` runs long sequences on): no ``(N, N)`` array, the
    attention's memory is that of :func:`~.sparse.blocked_attention`'s chunks, O(chunk N)
    for the complete mask and O(edges) for sparse ones. Returns ``(X_next, stats,
    n_zero_rows)`` with ``stats`` :func:`~.sparse.merge_row_statistics` of the layer's
    weights (``epsilon``, ``entropy``, ``row_mass_deficit``, each ``(B,)``) in place of ``A``.

    Parameters
    ----------
    X : float ``(B, N, d)``; plan : :class:`~.sparse.BlockPlan` of the mask.
    weights : ``W_Q, W_K`` ``(B, d, d_k)``, ``W_V`` ``(B, d, d)`` (per sample, as
        :func:`single_head_layer`) and ``scale``: scores ``q k^T * scale``.
    cfg : as :func:`single_head_layer`, softmax attention without ``qk_norm`` only (the
        kernel computes softmax of the plain scores). layer : as :func:`single_head_layer`.

    The update is :func:`single_head_layer`'s with the same association ``(A Z) W_V``; the
    two agree to round-off (``tests/phase/test_phase_long.py``).

    Raises
    ------
    ConfigError
        What :func:`single_head_layer` refuses, attention other than softmax, and no ``scale``.
    """
    _check_fast(cfg, weights)
    W_Q, W_K, W_V, scale = weights.W_Q, weights.W_K, weights.W_V, weights.scale
    if scale is None:
        raise ConfigError("the windowed kernel takes the score scale from the weights: set LayerWeights.scale")
    if cfg.attention != "softmax" or cfg.qk_norm:
        raise ConfigError(f"attention {cfg.attention!r} (qk_norm={cfg.qk_norm}) runs on the dense path only "
                          "(the windowed kernel computes softmax of the plain scores)")
    norm = lambda Y: _norm(Y, cfg, zero_rows, False)  # noqa: E731
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
    """The head's output ``O`` ``(..., N, d)``, divided row by row by its RMS with
    ``headwise_rmsnorm`` (:class:`~.config.BlockConfig`)."""
    return F.rms_norm(O, (O.shape[-1],), eps=cfg.eps) if cfg.headwise_rmsnorm else O


def _norm(Y: torch.Tensor, cfg: BlockConfig, zero_rows: str, direct: bool):
    if cfg.norm == "sphere":
        return sphere(Y, zero_rows=zero_rows, direct=direct)
    return apply_norm(Y, cfg.norm, cfg.eps, dyt_alpha=cfg.dyt_alpha)
