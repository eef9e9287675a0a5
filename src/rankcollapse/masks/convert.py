"""Conversions between :class:`Mask` and the formats of PyTorch SDPA, FlexAttention and
Hugging Face ``transformers.masking_utils``, which share ``M[i, j] = True`` = query i attends
to key j. Our ``causal_sliding_window:w`` is HF ``sliding_window=w`` (``kv > q - w``); our
``sliding_window:w=2h+1`` is HF's bidirectional ``sliding_window=h`` (``|q - kv| <= h``)."""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np
import torch

from .._validate import check_device, check_int
from ..errors import MaskError
from .mask import Mask


def to_additive(mask: Mask, *, dtype: torch.dtype = torch.float32,
                fill: Literal["-inf", "min"] = "-inf",
                device: torch.device | str | None = None) -> torch.Tensor:
    """Additive float mask ``(N, N)``: 0 where allowed, ``-inf`` (or ``finfo(dtype).min``
    with ``fill="min"``) where masked; add it to the attention logits before softmax."""
    if fill not in ("-inf", "min"):
        raise MaskError(f"fill must be '-inf' or 'min', got {fill!r}")
    neg = float("-inf") if fill == "-inf" else torch.finfo(dtype).min
    dense = mask.to_dense(device=device)
    zero = torch.zeros((), dtype=dtype, device=dense.device)
    return torch.where(dense, zero, torch.tensor(neg, dtype=dtype, device=dense.device))


def from_additive(additive: torch.Tensor, spec: str | None = None) -> Mask:
    """Mask from an additive ``(N, N)`` float mask: allowed iff the entry is finite and above
    ``finfo(dtype).min``. Raises :class:`MaskError` for a non-float tensor or an empty row."""
    if not isinstance(additive, torch.Tensor) or not additive.is_floating_point():
        raise MaskError("additive mask must be a floating-point torch tensor")
    allowed = torch.isfinite(additive) & (additive > torch.finfo(additive.dtype).min)
    return Mask.from_dense(allowed, spec=spec)


def to_hf_4d(mask: Mask, *, batch_size: int = 1, form: Literal["bool", "additive"] = "additive",
             dtype: torch.dtype = torch.float32,
             device: torch.device | str | None = None) -> torch.Tensor:
    """Hugging Face 4-D attention mask ``(batch_size, 1, N, N)``: ``form="bool"`` as
    ``sdpa_mask`` (True = attend), ``form="additive"`` as ``eager_mask`` (0 = attend,
    ``finfo(dtype).min`` = masked)."""
    if batch_size < 1:
        raise MaskError(f"batch_size must be >= 1, got {batch_size}")
    if form == "bool":
        base = mask.to_dense(device=device)
    elif form == "additive":
        base = to_additive(mask, dtype=dtype, fill="min", device=device)
    else:
        raise MaskError(f"form must be 'bool' or 'additive', got {form!r}")
    return base[None, None].expand(batch_size, 1, mask.n_tokens, mask.n_tokens).contiguous()


def from_hf_4d(mask4d: torch.Tensor, *, batch_index: int = 0, spec: str | None = None) -> Mask:
    """Mask of batch row ``batch_index`` of a Hugging Face 4-D mask ``(B, 1, N, N)`` (bool or
    additive). Raises :class:`MaskError` for another shape or a batch index out of range."""
    if mask4d.ndim != 4 or mask4d.shape[1] != 1:
        raise MaskError(f"HF 4-D mask must have shape (B, 1, N, N), got {tuple(mask4d.shape)}")
    if not 0 <= batch_index < mask4d.shape[0]:
        raise MaskError(f"batch_index {batch_index} outside 0..{mask4d.shape[0] - 1}")
    m = mask4d[batch_index, 0]
    return Mask.from_dense(m, spec=spec) if m.dtype == torch.bool else from_additive(m, spec=spec)


def block_counts(mask: Mask, block_size: int, *, rows_per_chunk: int = 1 << 16) -> np.ndarray:
    """Allowed entries in every ``block_size x block_size`` tile: int64 ``(n_b, n_b)``,
    ``n_b = ceil(N / block_size)``, from the CSR in O(E), ``rows_per_chunk`` query rows at a time."""
    csr = mask.to_csr()
    n, bs = mask.n_tokens, block_size
    nb = -(-n // bs)
    counts = np.zeros((nb, nb), dtype=np.int64)
    step = max(bs, rows_per_chunk // bs * bs)  # whole query blocks per chunk
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        lo, hi = csr.indptr[r0], csr.indptr[r1]
        q_block = np.repeat(np.arange(r0, r1, dtype=np.int64) // bs, np.diff(csr.indptr[r0 : r1 + 1]))
        tile = (q_block - r0 // bs) * nb + csr.indices[lo:hi].astype(np.int64) // bs
        q0, q1 = r0 // bs, -(-r1 // bs)
        counts[q0:q1] = np.bincount(tile, minlength=(q1 - q0) * nb).reshape(q1 - q0, nb)
    return counts


def _ordered_blocks(sel: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor]:
    """FlexAttention's ``(num_blocks, indices)`` of the tiles ``sel`` (bool ``(n_b, n_b)``)."""
    num = sel.sum(axis=1).astype(np.int32)
    order = np.argsort(~sel, axis=1, kind="stable").astype(np.int32)
    return (torch.as_tensor(num, device=device)[None, None],
            torch.as_tensor(order, device=device)[None, None])


def to_block_mask(mask: Mask, *, block_size: int = 128, device: torch.device | str = "cpu"):
    """FlexAttention ``BlockMask`` for ``mask`` from its tile counts (:func:`block_counts`;
    docs/masks.md, "FlexAttention block masks"): full tiles skip ``mask_mod``, partial ones
    use it; tiles cut by the sequence's end are never full. Raises :class:`MaskError` for
    ``block_size < 1``, :class:`ConfigError` for a ``device`` not present here.
    """
    from torch.nn.attention.flex_attention import BlockMask

    block_size = check_int(block_size, "block_size", low=1, error=MaskError)  # also beyond 64 bits
    device = check_device(device)
    n, bs = mask.n_tokens, block_size
    counts = block_counts(mask, bs)
    edge = np.full(counts.shape[0], bs, dtype=np.int64)
    edge[-1] = n - bs * (counts.shape[0] - 1)
    capacity = edge[:, None] * edge[None, :]
    full = counts == capacity
    if n % bs:
        full[-1, :] = full[:, -1] = False
    partial = (counts > 0) & ~full
    if partial.any():  # evaluate the predicate once eagerly: a lookup-table predicate builds
        zero = torch.zeros(1, dtype=torch.long, device=device)  # its table here, not under tracing
        mask.mask_mod(0, 0, zero, zero)
    kv_num, kv_idx = _ordered_blocks(partial, device)
    full_num, full_idx = _ordered_blocks(full, device)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=bs,
                                    mask_mod=mask.mask_mod, seq_lengths=(n, n))


def block_mask_to_dense(block_mask, *, device: torch.device | str = "cpu") -> torch.Tensor:
    """Dense bool ``(N, N)`` that FlexAttention actually applies for ``block_mask``: the
    support of ``flex_attention`` with equal scores and ``V = I`` (eager, O(N^2): small N)."""
    from torch.nn.attention.flex_attention import flex_attention

    device = check_device(device)
    n = block_mask.seq_lengths[0]
    q = torch.zeros(1, 1, n, 16, device=device)
    v = torch.eye(n, device=device)[None, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager (uncompiled) path notice
        out = flex_attention(q, q, v, block_mask=block_mask)
    return out[0, 0] > 0


def from_block_mask(block_mask, spec: str | None = None) -> Mask:
    """Mask read back from a FlexAttention ``BlockMask`` (see :func:`block_mask_to_dense`)."""
    return Mask.from_dense(block_mask_to_dense(block_mask), spec=spec)
