"""Long-sequence attention whose memory grows with the mask's edges, not ``N^2``: blocks of
``block_size`` queries each read a window of ``K_w`` keys, a chunk of blocks in one batched
matmul (docs/dynamics.md, "Long sequences and backends", gives the layouts). The result
equals dense masked attention (spec.md §1).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import threading

import numpy as np
import scipy.sparse
import torch

from ..errors import MaskError
from ..masks.rows import raise_empty
from .attention import (denormals_are_zero, denormals_flushable, flush_subnormal, safe_softmax_scores,
                        scores_may_overflow)
from .chunks import over_chunks
from .native import banded_kernel

DEFAULT_BLOCK_SIZE = 64
SCORE_BUDGET = 2 * 2**20  # bytes of float scores per chunk: small enough that the softmax passes stay in cache
NATIVE_CHUNKS = 8  # chunks of the inner blocks on the native kernel: a few per thread, for balance
CACHE_BUDGET = 2**19  # bytes of scores per chunk of one (B H) slice of a banded layout: stays in a core's L2


class BlockPlan:
    """Windows of a CSR mask, built once (vectorised, O(N + E)) and reused by every layer.

    ``csr``: ``scipy.sparse`` ``(N, N)``, nonzero = token i attends to j; or ``intervals``: ``(lo, hi)``
    int arrays ``(N,)``, row i attends keys ``lo[i] .. hi[i]`` (inclusive), built in O(N) without the CSR
    form. ``block_size``: query rows per block; ``device``: where the indices and local masks live.
    Attributes: ``kind`` (``"intervals"`` or ``"gathered"``), ``max_keys`` (``K_w``, keys every block
    reads), ``full_rows`` (int64 ``(G,)``, rows attending to all N tokens: a dense slab).

    Raises ``MaskError``: a non-square mask, a row with no allowed key, intervals outside
    ``0..N-1``, ``block_size < 1``.
    """

    def __init__(self, csr=None, *, intervals: tuple[np.ndarray, np.ndarray] | None = None,
                 block_size: int = DEFAULT_BLOCK_SIZE, device: torch.device | str | None = None):
        if (csr is None) == (intervals is None):
            raise MaskError("give exactly one of csr or intervals=(lo, hi)")
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
            raise MaskError(f"block_size must be an integer >= 1, got {block_size!r}")
        if intervals is not None:
            lo, hi = (np.asarray(a, dtype=np.int64) for a in intervals)
            n = lo.shape[0]
            counts = hi - lo + 1
            if hi.shape != lo.shape or (lo < 0).any() or (hi >= n).any():
                raise MaskError(f"intervals must be two (N,) arrays with 0 <= lo, hi < N={n}")
        else:
            csr = scipy.sparse.csr_array(csr)
            if not csr.has_canonical_format:
                csr.sum_duplicates()
            csr.eliminate_zeros()
            n, m = csr.shape
            if n != m:
                raise MaskError(f"mask must be square, got shape {csr.shape}")
            counts = np.diff(csr.indptr)
        raise_empty(np.flatnonzero(counts <= 0))
        self.n_tokens, self.n_edges, self.block_size = n, int(counts.sum()), int(block_size)
        self.n_blocks = -(-n // self.block_size)
        self.device = device
        full = counts == n
        if full.all() or n == 1:  # complete mask: one window of N keys serves every row
            full[:] = False
        self.full_rows = torch.as_tensor(np.flatnonzero(full), dtype=torch.long, device=device)
        if intervals is None:
            indptr, indices = csr.indptr.astype(np.int64), csr.indices
            lo, hi = indices[indptr[:-1]].astype(np.int64), indices[indptr[1:] - 1].astype(np.int64)
        if intervals is not None or bool(((hi - lo + 1 == counts) | full).all()):
            self._intervals(lo, hi, full)
        else:
            self._gathered(csr, full)

    # -------------------------------------------------------------- layouts
    def _pad_rows(self, a: np.ndarray, fill) -> np.ndarray:
        out = np.full(self.n_blocks * self.block_size, fill, dtype=a.dtype)
        out[: a.shape[0]] = a
        return out.reshape(self.n_blocks, self.block_size)

    def _intervals(self, lo: np.ndarray, hi: np.ndarray, full: np.ndarray) -> None:
        n, bq, nb = self.n_tokens, self.block_size, self.n_blocks
        big = np.iinfo(np.int64).max
        blo = self._pad_rows(np.where(full, big, lo), big).min(axis=1)
        bhi = self._pad_rows(np.where(full, -1, hi), -1).max(axis=1)
        base = np.arange(nb, dtype=np.int64) * bq
        none = blo == big  # blocks with only full or padding rows: any window will do
        blo, bhi = np.where(none, base, blo), np.where(none, base, bhi)
        c = int((blo - base).min())
        width_regular = int((bhi - base - c).max()) + 1
        width_own = int((bhi - blo).max()) + 1
        self.regular = width_regular <= width_own + bq // 4  # banded: windows slide by Bq
        self.kind = "intervals"
        self.max_keys = width_regular if self.regular else width_own
        starts = base + c if self.regular else blo
        self.pad_lo = max(0, -int(starts.min()))
        self.pad_hi = max(0, int(starts.max()) + self.max_keys - n)
        self.offset = c  # first window start (regular layout)
        row_start = np.repeat(starts, bq)[:n]
        # local bounds of each row inside its block's window; proxies (full rows, padding)
        # get key 0 of the window so that no row of the batched softmax is empty
        rel_lo = self._pad_rows(np.where(full, 0, lo - row_start), 0)
        rel_hi = self._pad_rows(np.where(full, 0, hi - row_start), 0)
        idx_dtype = torch.int32 if self.max_keys < 2**31 else torch.int64
        self.rel_lo = torch.as_tensor(rel_lo, dtype=idx_dtype, device=self.device)
        self.rel_hi = torch.as_tensor(rel_hi, dtype=idx_dtype, device=self.device)
        self.starts = torch.as_tensor(starts + self.pad_lo, dtype=torch.long, device=self.device)
        self.local = self.blocked = self.key_index = None
        self.proxy = self._proxy(full)
        # every row reads exactly its keys (the complete mask): nothing to mask
        self.all_allowed = self.proxy is None and bool((rel_lo == 0).all()) and bool((rel_hi == self.max_keys - 1).all())
        self._pattern()

    def _gathered(self, csr, full: np.ndarray) -> None:
        n, bq, nb = self.n_tokens, self.block_size, self.n_blocks
        keep = ~full
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(csr.indptr))
        cols = csr.indices.astype(np.int64)
        sel = keep[rows]
        rows, cols = rows[sel], cols[sel]
        pair = (rows // bq) * n + cols
        union = np.unique(pair)
        ub = union // n
        per_block = np.bincount(ub, minlength=nb)
        first = np.concatenate(([0], np.cumsum(per_block)[:-1]))
        width = max(int(per_block.max()), 1)
        key_index = np.full((nb, width), n, dtype=np.int64)  # n = the zero key appended at the end
        key_index[ub, np.arange(union.shape[0]) - first[ub]] = union % n
        local = np.zeros((nb, bq, width), dtype=bool)
        local[rows // bq, rows % bq, np.searchsorted(union, pair) - first[rows // bq]] = True
        proxy_rows = np.flatnonzero(np.concatenate((full, np.ones(nb * bq - n, dtype=bool))))
        local.reshape(nb * bq, width)[proxy_rows, 0] = True
        self.kind, self.regular, self.max_keys = "gathered", False, width
        self.pad_lo, self.pad_hi, self.offset = 0, 1, 0
        self.key_index = torch.as_tensor(key_index, device=self.device)
        self.local = torch.as_tensor(local, device=self.device)
        self.blocked = ~self.local
        self.rel_lo = self.rel_hi = self.starts = None
        self.all_allowed = False
        self.pattern_blocked = self.exceptions = self.exception_blocked = None
        self.proxy = self._proxy(full)

    def _pattern(self) -> None:
        """Shared ``(Bq, K_w)`` mask of a banded layout and the blocks differing from it (none if over a quarter)."""
        self.pattern_blocked = self.exceptions = self.exception_blocked = None
        if not self.regular:
            return
        mid = self.n_blocks // 2
        same = (self.rel_lo == self.rel_lo[mid]).all(dim=1) & (self.rel_hi == self.rel_hi[mid]).all(dim=1)
        if self.proxy is not None:
            same &= ~self.proxy.any(dim=1)
        exc = torch.nonzero(~same).flatten()
        if exc.numel() > self.n_blocks // 4:
            return
        self.pattern_blocked = ~self.allowed(mid, mid + 1)[0]
        self.exceptions = exc
        # first and last exception block (host ints): chunks outside skip the lookup
        self.exception_range = (int(exc.min()), int(exc.max())) if exc.numel() else (self.n_blocks, -1)
        self.exception_list = exc.tolist()  # ascending
        k = torch.arange(self.max_keys, device=self.rel_lo.device, dtype=self.rel_lo.dtype)
        self.exception_blocked = (k < self.rel_lo[exc, :, None]) | (k > self.rel_hi[exc, :, None])

    def _proxy(self, full: np.ndarray) -> torch.Tensor | None:
        """Bool ``(nb, Bq)``: placeholder rows (full rows, padding), left out of ε; or None."""
        pad = self.n_blocks * self.block_size - self.n_tokens
        if not pad and not full.any():
            return None
        return torch.as_tensor(self._pad_rows(full, True), device=self.device)

    # -------------------------------------------------------------- per chunk
    def blocks_per_chunk(self, batch_heads: int, itemsize: int, budget: int = SCORE_BUDGET) -> int:
        """Blocks whose ``(B H, Bq, K_w)`` scores fit in ``budget`` bytes."""
        per_block = batch_heads * self.block_size * self.max_keys * itemsize
        return max(1, min(self.n_blocks, budget // max(per_block, 1)))

    def allowed(self, b0: int, b1: int) -> torch.Tensor:
        """Bool local mask ``(b1 - b0, Bq, K_w)`` of blocks ``b0 .. b1 - 1``."""
        if self.local is not None:
            return self.local[b0:b1]
        k = torch.arange(self.max_keys, device=self.rel_lo.device, dtype=self.rel_lo.dtype)
        return (k >= self.rel_lo[b0:b1, :, None]) & (k <= self.rel_hi[b0:b1, :, None])

    def fill_masked(self, s: torch.Tensor, b0: int, b1: int) -> None:
        """Set the masked entries of scores ``s (..., b1 - b0, Bq, K_w)`` to ``-inf`` in place
        (banded masks: one broadcast fill of the pattern, the exceptions' own after)."""
        inf = float("-inf")
        if self.all_allowed:
            return
        if self.pattern_blocked is None:
            s.masked_fill_(self.blocked[b0:b1] if self.blocked is not None else ~self.allowed(b0, b1), inf)
            return
        pick = (self.exceptions >= b0) & (self.exceptions < b1)
        at = self.exceptions[pick] - b0
        raw = s[..., at, :, :] if at.numel() else None
        s.masked_fill_(self.pattern_blocked, inf)
        if raw is not None:
            s[..., at, :, :] = raw.masked_fill(self.exception_blocked[pick], inf)

    def biases(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Additive ``0/-inf`` masks of a banded layout in ``dtype`` (built once), the pattern's
        ``(Bq, K_w)`` and the exceptions' ``(E, Bq, K_w)``, for the fused score matmul."""
        cache = self.__dict__.setdefault("_biases", {})
        if dtype not in cache:
            inf = float("-inf")
            pattern = torch.zeros(self.pattern_blocked.shape, dtype=dtype, device=self.pattern_blocked.device)
            exc = torch.zeros(self.exception_blocked.shape, dtype=dtype, device=self.exception_blocked.device)
            cache[dtype] = (pattern.masked_fill_(self.pattern_blocked, inf), exc.masked_fill_(self.exception_blocked, inf))
        return cache[dtype]

    def workspace(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
        """Scratch tensor ``name`` of ``shape`` of the calling thread, kept for the plan's lifetime."""
        cache = self.__dict__.setdefault("_workspace", {})
        key = (threading.get_ident(), name, tuple(shape), dtype, str(device))
        if key not in cache:
            with torch.inference_mode(False):
                cache[key] = torch.empty(shape, dtype=dtype, device=device)
        return cache[key]

    @functools.cached_property
    def bounds32(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous int32 ``(nb, Bq)`` local bounds of every row (intervals layouts)."""
        return tuple(r.to(torch.int32).contiguous() for r in (self.rel_lo, self.rel_hi))

    def not_counted(self, b0: int, b1: int) -> torch.Tensor:
        """Bool ``(b1 - b0, Bq, K_w)``: entries left out of ε (masked keys, proxy rows)."""
        out = ~self.allowed(b0, b1)
        return out if self.proxy is None else out | self.proxy[b0:b1, :, None]

    def keys(self, Kp: torch.Tensor, b0: int, b1: int, first: int = 0) -> torch.Tensor:
        """Window keys ``(..., b1 - b0, K_w, d)`` of blocks ``b0 .. b1 - 1``: of the keys themselves
        or a slab whose row 0 is key ``first`` (regular layouts), else of the zero-padded keys."""
        if self.key_index is not None:
            return Kp[..., self.key_index[b0:b1], :]
        if self.regular:  # a strided view: window b starts b * Bq rows after window 0
            *lead, n_p, d = Kp.shape
            s = Kp.stride()
            start = self.offset + b0 * self.block_size - first
            return Kp.as_strided((*lead, b1 - b0, self.max_keys, d),
                                 (*s[:-2], self.block_size * s[-2], s[-2], s[-1]),
                                 Kp.storage_offset() + start * s[-2])
        idx = self.starts[b0:b1, None] + torch.arange(self.max_keys, device=Kp.device)
        return Kp[..., idx, :]

    def inner_blocks(self) -> tuple[int, int]:
        """Blocks ``b0 .. b1 - 1`` of a regular layout whose windows lie inside keys ``0 .. N - 1``."""
        bq, n, nb = self.block_size, self.n_tokens, self.n_blocks
        b0 = min(nb, max(0, -(self.offset // bq)))  # ceil(-offset / Bq)
        b1 = max(b0, min(nb, (n - self.max_keys - self.offset) // bq + 1))
        return b0, b1

    def window_slab(self, T: torch.Tensor, b0: int, b1: int) -> tuple[torch.Tensor, int]:
        """Rows of ``T (..., N, d)`` the windows of blocks ``b0 .. b1 - 1`` read (zero past either
        end), and the key index of the slab's row 0."""
        r0 = self.offset + b0 * self.block_size
        r1 = self.offset + (b1 - 1) * self.block_size + self.max_keys
        slab = T.new_zeros(*T.shape[:-2], r1 - r0, T.shape[-1])
        lo, hi = max(r0, 0), min(r1, self.n_tokens)
        if hi > lo:
            slab[..., lo - r0:hi - r0, :] = T[..., lo:hi, :]
        return slab, r0


def _pad_keys(K: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """``K (..., N, d)`` with ``lo`` zero rows before and ``hi`` after (one copy of K)."""
    if not lo and not hi:
        return K
    *lead, n, d = K.shape
    out = K.new_empty(*lead, lo + n + hi, d)
    out[..., :lo, :].zero_()
    out[..., lo + n:, :].zero_()
    out[..., lo:lo + n, :] = K
    return out


def _window_scores(q, k, plan: BlockPlan, b0: int, b1: int, scale: float, overflow: bool):
    """Masked (``-inf``), scaled scores ``(..., c, Bq, K_w)`` of blocks ``b0 .. b1 - 1``."""
    if not overflow and plan.pattern_blocked is not None and q.dim() == 3:
        return _banded_scores(q, k, plan, b0, b1, scale)
    s = torch.matmul(q, k.transpose(-1, -2))
    if scale != 1.0:
        s.mul_(scale)
    if overflow:  # clamp +-inf before max-subtraction, as masked_softmax does
        info = torch.finfo(s.dtype)
        s.clamp_(info.min, info.max)
    plan.fill_masked(s, b0, b1)
    return s


def _banded_scores(q, k, plan: BlockPlan, b0: int, b1: int, scale: float, out=None):
    """:func:`_window_scores` of one ``(B H)`` slice of a banded layout in one matmul, into ``out`` if given."""
    pattern, exc_bias = plan.biases(q.dtype)
    if plan.exception_range[0] <= b0 and b1 - 1 <= plan.exception_range[1]:
        j0, j1 = bisect.bisect_left(plan.exception_list, b0), bisect.bisect_left(plan.exception_list, b1)
        if j1 - j0 == b1 - b0:  # every block its own pattern (the ends): one matmul with theirs
            return torch.baddbmm(exc_bias[j0:j1], q, k.transpose(-1, -2), alpha=scale, out=out)
    s = torch.baddbmm(pattern, q, k.transpose(-1, -2), alpha=scale, out=out)
    if plan.exception_range[0] < b1 and plan.exception_range[1] >= b0:  # blocks near the ends: own pattern
        pick = (plan.exceptions >= b0) & (plan.exceptions < b1)
        at = plan.exceptions[pick] - b0
        s[at] = torch.baddbmm(exc_bias[pick], q[at], k[at].transpose(-1, -2), alpha=scale)
    return s


def blocked_attention(Q, K, V, plan: BlockPlan, *, scale: float, need_epsilon: bool = False,
                      overflow: bool | None = None, row_stats: dict | None = None):
    """Masked softmax attention on the windows of ``plan``.

    Q, K : ``(B, H, N, d_k)``; V : ``(B, H, N, d_v)``, float32 or float64. Returns
    ``(out (B, H, N, d_v), eps)``, ``eps`` the smallest allowed entry (0-d) with
    ``need_epsilon``. ``overflow``: the caller's verdict of
    :func:`~rankcollapse.dynamics.attention.scores_may_overflow` (None = compute it; if so,
    scores in float64). ``row_stats``: a dict that receives the :func:`row_statistics` of
    every chunk (for :func:`merge_row_statistics`). Weights below ``finfo.tiny`` are 0 in
    ``A V``: without ε and row statistics the chunks run in flush-to-zero mode
    (:func:`~rankcollapse.dynamics.attention.denormals_are_zero`), else they are read first
    and :func:`~rankcollapse.dynamics.attention.flush_subnormal` zeroes them after.
    """
    B, H, N, d_k = Q.shape
    d_v = V.shape[-1]
    bq, nb = plan.block_size, plan.n_blocks
    if overflow is None:
        overflow = scores_may_overflow(Q, K, scale)
    work = torch.float64 if overflow else Q.dtype
    n_p = nb * bq
    Qp = torch.nn.functional.pad(Q, (0, 0, 0, n_p - N)) if n_p != N else Q
    flat = B * H == 1  # 3-D bmm on strided window views; larger batches: 5-D matmul (copies)
    Qb = Qp.reshape(nb, bq, d_k) if flat else Qp.reshape(B, H, nb, bq, d_k)
    # one (B H) slice of a banded layout: scores and weights in per-thread buffers kept by the
    # plan (per-chunk allocations would stay resident in per-thread malloc arenas)
    fused = flat and not overflow and plan.pattern_blocked is not None
    step = plan.blocks_per_chunk(B * H, torch.finfo(work).bits // 8, CACHE_BUDGET if fused else SCORE_BUDGET)
    # regular layouts: views of K and V, a small zero-padded slab at the ends; others: padded once
    slabs = plan.regular
    if slabs:
        Kp, Vp = (T if T.stride(-1) == 1 else T.contiguous() for T in (K, V))
        inner = plan.inner_blocks()
        bounds = [(b, min(b + step, e)) for s, e in ((0, inner[0]), inner, (inner[1], nb)) for b in range(s, e, step)]
    else:
        Kp, Vp = (_pad_keys(T, plan.pad_lo, plan.pad_hi).contiguous() for T in (K, V))
        bounds = [(b, min(b + step, nb)) for b in range(0, nb, step)]
    if flat:
        Kp, Vp = Kp.reshape(-1, d_k), Vp.reshape(-1, d_v)
    if overflow:
        Qb, Kp = Qb.to(work), Kp.to(work)
    out = torch.empty(*Qb.shape[:-1], d_v, dtype=V.dtype, device=V.device)  # (..., nb, Bq, d_v)
    lows = []
    # nobody reads the weights: softmax and A V in flush-to-zero mode, which drops subnormal
    # weights as flush_subnormal does, without its pass and the slow exp of subnormal results
    grad = torch.is_grad_enabled() and any(T.requires_grad for T in (Q, K, V))
    ftz = (row_stats is None and not need_epsilon and not grad and Q.device.type == "cpu"
           and V.dtype in (torch.float32, torch.float64) and denormals_flushable())
    # float32 banded layouts of one (B H) slice: the native kernel (built at install time), if any
    native = None
    if flat and slabs and ftz and not overflow and Q.dtype == K.dtype == V.dtype == torch.float32:
        native = banded_kernel()
        rows = (Qb.stride(1), Kp.stride(0), Vp.stride(0))
        if Qb.stride(0) != bq * rows[0] or Qb.stride(-1) != 1 or Kp.stride(1) != 1 or Vp.stride(1) != 1:
            native = None
    if native is not None:  # its working set is one block: NATIVE_CHUNKS chunks, not cache-sized ones
        lo, hi = plan.bounds32
        wide = -(-nb // NATIVE_CHUNKS)
        bounds = [(b, min(b + wide, nb)) for b in range(0, nb, wide)]

    def windows(T: torch.Tensor, b0: int, b1: int) -> torch.Tensor:
        """Window keys (or values) ``(..., b1 - b0, K_w, d)`` of blocks ``b0 .. b1 - 1``."""
        if not slabs:
            return plan.keys(T, b0, b1)
        if inner[0] <= b0 and b1 <= inner[1]:
            return plan.keys(T, b0, b1)
        slab, first = plan.window_slab(T, b0, b1)
        return plan.keys(slab, b0, b1, first=first)

    def chunk(bounds: tuple[int, int]) -> None:
        b0, b1 = bounds
        if native is not None:
            if native(Qb.data_ptr(), rows[0], Kp.data_ptr(), rows[1], Vp.data_ptr(), rows[2], out.data_ptr(), d_v,
                      b0, b1, bq, plan.max_keys, plan.offset, N, d_k, d_v, lo.data_ptr(), hi.data_ptr(), scale):
                raise MemoryError("the native windowed kernel could not allocate its block buffers")
            return
        q, k = Qb[..., b0:b1, :, :], windows(Kp, b0, b1)
        if fused:
            shape = (step, bq, plan.max_keys)
            s = _banded_scores(q, k, plan, b0, b1, scale, out=plan.workspace("scores", shape, V.dtype, V.device)[: b1 - b0])
            weights = s if row_stats is None else plan.workspace("weights", shape, V.dtype, V.device)[: b1 - b0]
            A = torch.ops.aten._softmax.out(s, -1, False, out=weights)
        else:
            s = _window_scores(q, k, plan, b0, b1, scale, overflow)
            A = torch.softmax(s, dim=-1).to(V.dtype)  # (..., c, Bq, K_w)
        if need_epsilon:
            lows.append(A.masked_fill(plan.not_counted(b0, b1), float("inf")).amin())
        if row_stats is not None:  # one key per chunk: chunks may run on worker threads
            row_stats[b0] = row_statistics(A, None if plan.all_allowed else plan.not_counted(b0, b1),
                                           None if plan.proxy is None else plan.proxy[b0:b1], scores=s)
        if not ftz:
            flush_subnormal(A)  # after ε: subnormal weights slow the A V matmul several times
        v = windows(Vp, b0, b1)
        if flat:
            torch.bmm(A, v, out=out[b0:b1])
        else:
            out[..., b0:b1, :, :] = torch.matmul(A, v)

    # a few chunks bound the score memory
    over_chunks(chunk, bounds, Q.device, per_thread=denormals_are_zero if ftz else contextlib.nullcontext)
    out = out.reshape(B, H, n_p, d_v)[:, :, :N]
    if plan.full_rows.numel():  # global queries: a dense (G, N) slab
        rows = plan.full_rows.to(Q.device)
        qf = Q.index_select(-2, rows)
        every = torch.ones(1, N, dtype=torch.bool, device=Q.device)
        Af = safe_softmax_scores(qf, K, every, scale=scale, overflow=overflow)  # (B, H, G, N)
        out[:, :, rows] = Af @ V
        if need_epsilon:
            lows.append(Af.amin())
        if row_stats is not None:
            row_stats[nb] = row_statistics(Af.unsqueeze(-3), None)
    eps = torch.stack(lows).amin() if need_epsilon else None
    return out, eps


def row_statistics(A: torch.Tensor, skip: torch.Tensor | None, proxy: torch.Tensor | None = None, *,
                   scores: torch.Tensor | None = None) -> tuple:
    """Per-``(B, H)`` sums over the real rows of a chunk of windowed weights ``A`` ``(c, Bq, K_w)``
    or ``(B, H, c, Bq, K_w)``, for :func:`merge_row_statistics`. skip : bool ``(c, Bq, K_w)``,
    entries that are not allowed keys; proxy : bool ``(c, Bq)``, placeholder rows; scores : the
    masked scores ``A`` is the softmax of; each or None.

    Returns ``(low, entropy_sum, entropy_rows, deficit_sum, rows)``, each ``(B, H)``: the smallest
    allowed entry, the sum of ``H_i / log k_i`` over rows with ``k_i >= 2`` keys and their number
    (:func:`rankcollapse.metrics.attention.row_entropy`), the sum of ``1 - sum_j A_ij`` and the
    number of rows. With ``scores``, ``H_i = lse_i - sum_j A_ij s_ij``, ``lse_i = max_j s_ij - log
    max_j A_ij`` (one pass of logarithms fewer; equal to round-off)."""
    A = A if A.dim() == 5 else A.view(1, 1, *A.shape)
    shape = A.shape[-3:-1]
    real = torch.ones(shape, dtype=torch.bool, device=A.device) if proxy is None else ~proxy
    if skip is None:
        keys = torch.full(shape, A.shape[-1], device=A.device)
        low = (A if proxy is None else A.masked_fill(proxy[..., None], float("inf"))).amin(dim=(-1, -2, -3))
    else:
        keys = (~skip).sum(-1)  # allowed keys of each row (proxy rows included: masked by `real`)
        low = A.masked_fill(skip if proxy is None else skip | proxy[..., None], float("inf")).amin(dim=(-1, -2, -3))
    if scores is not None:
        s = scores if scores.dim() == 5 else scores.view(A.shape)
        lse = s.amax(-1) - torch.log(A.amax(-1))
        H = lse - (A * s).nan_to_num_(nan=0.0).sum(-1)  # masked: 0 * -inf = nan -> 0
    else:
        tiny = torch.finfo(A.dtype).tiny
        H = -torch.where(A > 0, A * torch.log(A.clamp_min(tiny)), torch.zeros((), dtype=A.dtype)).sum(-1)
    w = (real & (keys >= 2)).to(A.dtype)
    Hn = H / torch.log(keys.clamp_min(2).to(A.dtype))
    deficit = ((1.0 - A.sum(-1)) * real.to(A.dtype)).sum(dim=(-1, -2))
    return low, (Hn * w).sum(dim=(-1, -2)), w.sum().expand(low.shape), deficit, real.sum().to(A.dtype).expand(low.shape)


def merge_row_statistics(row_stats: dict) -> dict[str, torch.Tensor]:
    """``{"epsilon", "entropy", "row_mass_deficit"}``, each ``(B, H)``, from every chunk's
    :func:`row_statistics`: the smallest allowed entry, the mean normalised row entropy (NaN
    without a row of >= 2 keys), the mean deficit; summed in block order (schedule-free)."""
    parts = [row_stats[k] for k in sorted(row_stats)]
    low = torch.stack([p[0] for p in parts]).amin(0)
    total = [torch.stack([p[i] for p in parts]).sum(0) for i in range(1, 5)]
    return {"epsilon": low, "entropy": total[0] / total[1], "row_mass_deficit": total[2] / total[3]}
