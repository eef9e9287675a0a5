"""Long-sequence attention whose memory grows with the mask's edges, not ``N^2``.

Queries are processed in blocks of ``block_size`` rows. For each block the union of the
keys its rows may attend to is read from the mask's CSR form; scores are computed only
against those keys and masked with the block's local pattern, then the masked softmax of
spec.md §1 is applied. For a banded mask of width ``w`` a block touches about
``block_size + w`` keys, so peak memory is ``O(B H block_size (block_size + w))``. The
result equals dense masked attention (same formula, same keys; verified to 1e-5 in
``tests/dynamics``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse
import torch

from ..errors import MaskError
from ..masks.rows import check_rows_allow_key
from .attention import safe_softmax_scores, scores_may_overflow


@dataclass
class QueryBlock:
    """Rows ``[start, stop)``; keys either the slice ``[k_start, k_stop)`` (contiguous)
    or the index tensor ``keys``; ``local`` bool ``(stop - start, n_keys)``."""

    start: int
    stop: int
    k_start: int
    k_stop: int
    keys: torch.Tensor | None
    local: torch.Tensor


class BlockPlan:
    """Query blocks of a CSR mask, built once and reused by every layer.

    Parameters
    ----------
    csr : ``scipy.sparse`` matrix/array ``(N, N)``, nonzero = token i attends to j.
    block_size : rows per query block (default 128).
    device : where the local masks and key indices live.

    Raises
    ------
    MaskError
        Non-square mask or a row with no allowed key.
    """

    def __init__(self, csr, *, block_size: int = 128, device: torch.device | str | None = None):
        csr = scipy.sparse.csr_array(csr)
        csr.sum_duplicates()
        csr.eliminate_zeros()
        n, m = csr.shape
        if n != m:
            raise MaskError(f"mask must be square, got shape {csr.shape}")
        check_rows_allow_key(csr)
        if block_size < 1:
            raise MaskError(f"block_size must be >= 1, got {block_size}")
        self.n_tokens, self.n_edges, self.block_size = n, int(csr.nnz), block_size
        self.blocks = [self._block(csr, s, min(s + block_size, n), device) for s in range(0, n, block_size)]

    @staticmethod
    def _block(csr, start: int, stop: int, device) -> QueryBlock:
        lo, hi = csr.indptr[start], csr.indptr[stop]
        cols = csr.indices[lo:hi]
        keys = np.unique(cols)
        rows = np.repeat(np.arange(stop - start), np.diff(csr.indptr[start : stop + 1]))
        local = np.zeros((stop - start, keys.size), dtype=bool)
        local[rows, np.searchsorted(keys, cols)] = True
        contiguous = keys[-1] - keys[0] + 1 == keys.size
        key_index = None if contiguous else torch.as_tensor(keys, dtype=torch.long, device=device)
        return QueryBlock(start, stop, int(keys[0]), int(keys[-1]) + 1, key_index,
                          torch.as_tensor(local, device=device))

    @property
    def max_keys(self) -> int:
        """Largest number of keys any block touches (sets the peak score memory)."""
        return max(b.local.shape[1] for b in self.blocks)


def blocked_attention(Q, K, V, plan: BlockPlan, *, scale: float, need_epsilon: bool = False,
                      overflow: bool | None = None):
    """Masked softmax attention block by block.

    Q, K : ``(B, H, N, d_k)``; V : ``(B, H, N, d_v)``. Returns ``(out (B, H, N, d_v),
    eps)`` with ``eps`` the smallest allowed attention entry (0-d tensor) when
    ``need_epsilon`` else None. ``overflow``: a caller's a-priori verdict of
    :func:`~rankcollapse.dynamics.attention.scores_may_overflow` (None = compute it).
    """
    out = torch.empty(*Q.shape[:-1], V.shape[-1], dtype=V.dtype, device=V.device)
    eps = None
    if overflow is None:
        overflow = scores_may_overflow(Q, K, scale)  # once for all blocks
    use_sdpa = not need_epsilon and not overflow
    for blk in plan.blocks:
        if blk.keys is None:
            k, v = K[..., blk.k_start : blk.k_stop, :], V[..., blk.k_start : blk.k_stop, :]
        else:
            k, v = K.index_select(-2, blk.keys), V.index_select(-2, blk.keys)
        q = Q[..., blk.start : blk.stop, :]  # (B, H, Bq, d_k)
        if use_sdpa:  # bounded scores: exact, no per-block check (see dense_attention)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=blk.local, scale=scale)
        else:
            A = safe_softmax_scores(q, k, blk.local, scale=scale, overflow=overflow)  # (B, H, Bq, K_b)
            o = A @ v
            if need_epsilon:
                low = A.masked_fill(~blk.local, float("inf")).amin()
                eps = low if eps is None else torch.minimum(eps, low)
        out[..., blk.start : blk.stop, :] = o
    return out, eps
