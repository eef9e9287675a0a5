"""Masked softmax attention (theory.md §1), the reference dense path.

``A = softmax_G(X W_Q (X W_K)^T / sqrt(d_qk))`` with ``A[i, j] = 0`` where
``mask[i, j]`` is False. Rows of ``A`` sum to 1 and allowed entries are > 0.
"""

from __future__ import annotations

import math

import torch

from ..errors import MaskError


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row softmax of ``scores`` restricted to ``mask``; masked entries are exactly 0.

    Parameters
    ----------
    scores : float tensor ``(..., N, N)``.
    mask : bool tensor broadcastable to ``scores``; ``mask[..., i, j]`` = i attends to j.

    Numerically stable for huge logits (the row max over allowed entries is subtracted).

    Raises
    ------
    MaskError
        If some row has no allowed key (names the first such rows).
    """
    allowed = mask.expand_as(scores) if mask.shape != scores.shape else mask
    empty = ~allowed.any(dim=-1)
    if bool(empty.any()):
        rows = torch.nonzero(empty.reshape(-1, empty.shape[-1]).any(0)).flatten()[:10].tolist()
        raise MaskError(f"rows {rows} of the mask allow no key (softmax over nothing)")
    neg = torch.finfo(scores.dtype).min
    s = scores.masked_fill(~allowed, neg)
    s = s - s.amax(dim=-1, keepdim=True)
    e = torch.exp(s).masked_fill(~allowed, 0.0)
    return e / e.sum(dim=-1, keepdim=True)


def attention_weights(
    X: torch.Tensor,
    mask: torch.Tensor,
    W_Q: torch.Tensor,
    W_K: torch.Tensor,
    *,
    d_qk: float,
) -> torch.Tensor:
    """Single-head attention matrix.

    Parameters
    ----------
    X : ``(N, d)`` or ``(B, N, d)`` tokens.
    mask : bool ``(N, N)``.
    W_Q, W_K : ``(d, d_k)`` (row-vector convention ``x -> x W``).
    d_qk : temperature, > 0 (theory.md §1; smaller = sharper).

    Returns
    -------
    A : ``(N, N)`` or ``(B, N, N)``, row-stochastic, zero off the mask.
    """
    if d_qk <= 0:
        raise ValueError(f"d_qk must be > 0, got {d_qk}")
    Q = X @ W_Q
    K = X @ W_K
    scores = Q @ K.transpose(-1, -2) / math.sqrt(d_qk)
    return masked_softmax(scores, mask)
