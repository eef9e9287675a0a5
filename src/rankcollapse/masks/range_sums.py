"""Weighted sums of a non-negative vector over fixed index ranges, in O(N) per vector and
without subtraction (:class:`RangeSums`), for the influence profiles of interval masks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Scans along longer blocks run in two stages (sub-blocks of about the square root).
SEQUENTIAL_SCAN = 1024


class RangeSums:
    """``RangeSums(n, a, b, r)(x)[k] = sum_{i=a[k]}^{b[k]} x[i] r^(i - a[k])`` (0 where ``a[k] > b[k]``)
    for non-negative float64 ``x`` of length ``n``, ``0 <= r <= 1``: planned once, O(N + K) per call.

    A disjoint sparse table on ``x`` padded to ``M = 2^p >= n``: at block size ``2^j`` (picked by
    :func:`_levels`) a range is one suffix plus ``r^(m - a)`` times one prefix of blocks, or one of them.

    Only non-negative terms are added, so the error is relative for every normal entry: with
    ``r = 1`` at most ``(S + 1) eps / 2``, ``S`` the terms a scan adds in sequence (``B`` up to
    :data:`SEQUENTIAL_SCAN`, else ``~ 2 sqrt(B)``); with ``r < 1`` suffix scans add along a tree and
    the weights ``r^d`` err by ``~ d |log r| eps``. Memory ``O(M + K)``.
    """

    def __init__(self, n: int, a: np.ndarray | None, b: np.ndarray | None, r: float = 1.0) -> None:
        """``a = b = None``: every suffix, ``[k, n - 1]`` for ``k < n``."""
        self.n, self.r = int(n), float(r)
        self.log_r = math.log(r) if r > 0.0 else -math.inf  # exp(-m) underflows to 0 for m > ~745
        top = max(0, (self.n - 1).bit_length())
        self.size = 1 << top  # M
        index = np.int32 if 4 * self.size < 2**31 else np.int64  # positions in the buffer (< 3 M + 1)
        if a is None:
            self.k, every = self.n, True
        else:
            a, b = np.asarray(a), np.asarray(b)
            self.k = a.shape[0]
            every = self.k == self.n and (b == self.n - 1).all() and (a == np.arange(self.n)).all()
        # where a range reads its first and second part (-1: the zero at the end of the buffer)
        ia = ib = factor = multi = None
        if every:
            # every suffix of x, in order: one scan of the whole vector read as one run
            step = _substep(self.size)
            self.levels = [_Level(self.size, step, slice(0, 1), 0, self.size, None, 0, 0, None)]
            self.second = self.factor = None
            self.whole_suffix = step > 1 and self.r == 1.0
            if self.whole_suffix:  # the scan alone (_suffixes)
                self.buffer = np.empty(self.size)
                return
            self.buffer = np.zeros(2 * self.size + 1)
            self.first = _Gather.run(2 * self.size - 1 if step > 1 else self.size, -1 if step > 1 else 1, self.k)
            return
        self.whole_suffix = False
        a, b = a.astype(index, copy=False), b.astype(index, copy=False)
        last = self.n - 1  # a range ending here may end with any block holding it (zeros after)
        if self.k and ((b == last).all() or (a == 0).all()) and (a <= b).all():
            levels: list = [(top, None)]  # suffixes (prefixes) of the whole vector: one scan
        elif (a >= b).any():  # empty ranges read nothing, one-term ranges x itself
            multi = np.flatnonzero(a < b)
            ia, ib = np.full(self.k, -1, dtype=index), np.full(self.k, -1, dtype=index)
            single = np.flatnonzero(a == b)
            ia[single] = a[single]
            factor = np.ones(self.k)
            a, b = a[multi], b[multi]
            levels = _levels(a, b, top, last)
        else:
            levels = _levels(a, b, top, last)
        self.levels: list[_Level] = []
        size = self.size
        for j, sel in levels:
            part = (a, b) if sel is None else (a[sel], b[sel])
            lv, size, first, second, f = _Level.plan(j, *part, last, size, self.log_r)
            self.levels.append(lv)
            into = sel if multi is None else (multi if sel is None else multi[sel])
            if into is None:  # one level serves every range
                ia, ib, factor = first, second, f
                continue
            if ia is None:
                ia, ib, factor = np.full(self.k, -1, dtype=index), np.full(self.k, -1, dtype=index), np.ones(self.k)
            ia[into] = first
            if second is not None:
                ib[into] = second
            if f is not None:
                factor[into] = f
        if ia is None:  # no ranges
            ia = np.full(self.k, -1, dtype=index)
        self.buffer = np.zeros(size + 1)  # x padded, every level's scans, a trailing 0
        self.first = _Gather(ia, size + 1)
        self.second = None if ib is None or all(lv.prefix_rows is None for lv in self.levels) else _Gather(ib, size + 1)
        self.factor = factor if self.second is not None and self.log_r != 0.0 else None

    def __call__(self, x: np.ndarray, divisor: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """The range sums (float64 ``(K,)``) of ``x`` (or ``x / divisor``), into ``out`` if given;
        else, when every suffix is asked for, a view of the plan's storage that the next call overwrites."""
        buf = self.buffer
        if self.whole_suffix:
            return self._suffixes(x, divisor, out)
        if divisor is None:
            buf[:self.n] = x
        else:
            np.divide(x, divisor, out=buf[:self.n])
        padded = buf[:self.size]
        for lv in self.levels:
            lv.scan(padded, buf, self.r)
        sums = self.first(buf)
        if self.second is not None:
            second = self.second(buf)
            sums += second if self.factor is None else self.factor * second
        if out is None:
            return sums
        out[...] = sums
        return out

    def _suffixes(self, x: np.ndarray, divisor: np.ndarray | None, out: np.ndarray | None) -> np.ndarray:
        """Every suffix sum of ``x`` (``r = 1``, ``M`` > :data:`SEQUENTIAL_SCAN`): :func:`_cumsum`'s
        two stages on the reversed vector, the second straight into ``out`` when its blocks align."""
        m, n, step = self.size, self.n, self.levels[0].step
        scan = self.buffer
        scan[:m - n] = 0.0
        if divisor is None:
            scan[m - n:] = x[::-1]
        else:
            np.divide(x[::-1], divisor[::-1], out=scan[m - n:])
        skip, part = divmod(m - n, step)  # whole blocks of zeros before x; x's first block not whole
        if out is None or part:
            _cumsum(None, scan.reshape(1, m), step)
            if out is None:
                return scan[m - n:][::-1]
            out[...] = scan[m - n:][::-1]
            return out
        inner = scan.reshape(-1, step)
        np.cumsum(inner, axis=1, out=inner)
        carry = np.cumsum(inner[:-1, -1])[skip:, None]  # as in _cumsum (the zero blocks add 0)
        dest = out[::-1].reshape(-1, step)
        dest[0] = inner[skip]
        np.add(inner[skip + 1:], carry, out=dest[1:])
        return out


def _levels(a: np.ndarray, b: np.ndarray, top: int, last: int) -> list[tuple[int, np.ndarray | None]]:
    """Block sizes ``2^j`` for the ranges ``[a, b]`` (``a < b <= last``) and the ranges each
    serves (``None``: all). Each round counts the candidate levels of up to ~1024 evenly spaced
    unserved ranges and takes the one serving most (the larger on ties)."""
    out: list[tuple[int, np.ndarray | None]] = []
    left: np.ndarray | None = None  # indices of the ranges still unserved (None: all)
    while a.shape[0] and (left is None or left.shape[0]):
        la, lb = (a, b) if left is None else (a[left], b[left])
        stride = max(1, la.shape[0] // 1024)
        sa, sb = la[::stride], lb[::stride]
        j0 = np.frexp((sb - sa).astype(np.float64))[1]  # ceil(log2 L)
        low = j0 - 1
        at_low, at_high = _served(sa, sb, low, last), _served(sa, sb, j0, last)
        upward = (sa == 0) | (sb == last)
        counts = np.bincount(low[at_low & ~upward], minlength=top + 1)
        counts += np.bincount(j0[at_high & ~upward], minlength=top + 1)
        counts += np.cumsum(np.bincount(np.where(at_low, low, j0)[upward], minlength=top + 1))[:top + 1]
        j = top - int(np.argmax(counts[::-1]))
        take = _served(la, lb, j, last)
        if take.all():
            out.append((j, left))
            break
        taken = np.flatnonzero(take)
        out.append((j, taken if left is None else left[taken]))
        rest = np.flatnonzero(~take)
        left = rest if left is None else left[rest]
    return out


def _served(a: np.ndarray, b: np.ndarray, j: Any, last: int) -> np.ndarray:
    """Whether ``[a, b]`` is served at blocks of ``2^j`` (one ending at ``last`` taken to its block's end)."""
    mask = (1 << j) - 1
    b = np.where(b == last, b | mask, b)
    ra, rb = a >> j, b >> j
    return (rb == ra + 1) | ((ra == rb) & (((a & mask) == 0) | ((b & mask) == mask)))


class _Gather:
    """``buf[idx]``, read as one slice plus a few exceptions when ``idx`` is mostly a run ``start +- arange(K)``."""

    def __init__(self, idx: np.ndarray, length: int) -> None:
        k = idx.shape[0]
        self.idx, self.k, self.start = idx, k, None
        if k < 2:
            return
        mid = k // 2
        self.sign = sign = 1 if idx[mid] - idx[mid - 1] >= 0 else -1
        offset = idx - sign * np.arange(k)
        start = int(offset[mid])
        if sign == 1:  # run positions inside the buffer
            lo, hi = max(0, -start), min(k, length - start)
        else:
            lo, hi = max(0, start - length + 1), min(k, start + 1)
        off_run = offset != start
        off_run[:lo] = off_run[hi:] = True
        exceptions = np.flatnonzero(off_run)
        if exceptions.shape[0] <= k // 4:
            self.start, self.span, self.idx = start, (lo, hi), None
            self.exceptions, self.sources = exceptions, idx[exceptions].astype(np.intp)
        else:
            self.idx = idx.astype(np.intp)

    @classmethod
    def run(cls, start: int, sign: int, k: int) -> _Gather:
        """``buf[start + sign * arange(k)]``, all inside the buffer."""
        out = cls(np.zeros(0, dtype=np.int64), 0)
        out.start, out.sign, out.k, out.span, out.idx = start, sign, k, (0, k), None
        out.exceptions = out.sources = np.zeros(0, dtype=np.int64)
        return out

    def __call__(self, buf: np.ndarray) -> np.ndarray:
        if self.start is None:
            return buf[self.idx]
        lo, hi = self.span
        if self.sign == 1:
            run = buf[self.start + lo:self.start + hi]
        else:
            run = buf[self.start - hi + 1:self.start - lo + 1][::-1]
        if lo == 0 and hi == self.k:
            out = run.copy()
        else:
            out = np.empty(self.k)
            out[lo:hi] = run
        if self.exceptions.shape[0]:
            out[self.exceptions] = buf[self.sources]
        return out


@dataclass
class _Level:
    """The scans one block size ``2^j`` contributes to a :class:`RangeSums` plan."""

    block: int
    step: int  # block length of the two-stage scans (1: one stage)
    suffix_rows: Any  # slice or index array of the blocks whose suffix sums are read
    suffix_from: int  # first column of those scans
    suffix_at: int  # offset of the (rows, block - suffix_from) scans in the buffer (rows reversed when step > 1)
    prefix_rows: Any
    prefix_to: int  # columns [0, prefix_to) of the prefix scans
    prefix_at: int
    weights: np.ndarray | None  # r^t, t < prefix_to, for r < 1

    @classmethod
    def plan(cls, j: int, a: np.ndarray, b: np.ndarray, end: int, at: int, log_r: float) -> tuple:
        """Scans at block size ``2^j`` for the ranges ``[a, b]`` served there, placed from ``at``.
        Returns the level, the end of its scans, each range's first and second read (buffer
        positions, -1 for none; the second None when no range has one) and the second's factor."""
        block = 1 << int(j)
        step, last = _substep(block), block - 1
        b = np.where(b == end, b | last, b)
        ra, rb, ca, cb = a >> j, b >> j, a & last, b & last
        crossing = ra != rb
        # a range inside one block that starts with it reads its prefix; every other a suffix
        prefix_only = (ca == 0) & (cb != last) & ~crossing
        some_prefix_only = bool(prefix_only.any())
        if some_prefix_only and prefix_only.all():
            suffix_rows, n_suffix, suffix_from, width = None, 0, 0, 0
            first = np.full(a.shape[0], -1, dtype=a.dtype)
        else:
            suffix_rows, rank, n_suffix = _rows(ra, ~prefix_only if some_prefix_only else None)
            suffix_from = int((np.where(prefix_only, last, ca) if some_prefix_only else ca).min()) // step * step
            width = block - suffix_from
            if step > 1:  # long rows are stored from the block's end (their second stage runs forward)
                first = (at + width - 1 + suffix_from) + rank * width - ca
            else:
                first = (at - suffix_from) + rank * width + ca
            if some_prefix_only:
                first[prefix_only] = -1
        suffix_at, at = at, at + n_suffix * width
        wants_prefix = crossing | prefix_only
        second = f = prefix_rows = weights = None
        prefix_to = prefix_at = 0
        if wants_prefix.any():
            every = bool(wants_prefix.all())
            prefix_rows, rank, n_prefix = _rows(rb, None if every else wants_prefix)
            prefix_to = -(-(int((cb if every else np.where(wants_prefix, cb, 0)).max()) + 1) // step) * step
            second = at + rank * prefix_to + cb
            if not every:
                second[~wants_prefix] = -1
            prefix_at, at = at, at + n_prefix * prefix_to
            if log_r != 0.0:
                f = np.where(crossing, _power(log_r, np.maximum((rb << j) - a, 0)), 1.0)  # r^(m - a)
                weights = _power(log_r, np.arange(prefix_to))
        lv = cls(block, step, suffix_rows, suffix_from, suffix_at, prefix_rows, prefix_to, prefix_at, weights)
        return lv, at, first, second, f

    def scan(self, padded: np.ndarray, buf: np.ndarray, r: float) -> None:
        blocks = padded.reshape(-1, self.block)
        if self.suffix_rows is not None:
            x = blocks[self.suffix_rows, self.suffix_from:]
            out = buf[self.suffix_at:self.suffix_at + x.size].reshape(x.shape)
            if self.step == 1:
                out = out[:, ::-1]
            if r == 1.0:
                _cumsum(x[:, ::-1], out, self.step)
            else:
                _geometric_suffix(x, r, out[:, ::-1])
        if self.prefix_rows is not None:
            x = blocks[self.prefix_rows, :self.prefix_to]
            out = buf[self.prefix_at:self.prefix_at + x.size].reshape(x.shape)
            _cumsum(x if self.weights is None else x * self.weights, out, self.step)


def _rows(rows: np.ndarray, wanted: np.ndarray | None = None) -> tuple[Any, np.ndarray, int]:
    """The blocks in ``rows`` (where ``wanted``), as a slice when ``rows`` is sorted without gaps;
    each entry's position among them; their count."""
    if rows.shape[0] == 0:
        return None, rows, 0
    step = np.diff(rows)
    if ((step == 0) | (step == 1)).all():
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        return slice(lo, hi), rows - lo, hi - lo
    lo, hi = int(rows.min()), int(rows.max()) + 1
    used = np.bincount(rows - lo, weights=wanted, minlength=hi - lo) > 0
    return np.flatnonzero(used) + lo, (np.cumsum(used) - 1)[rows - lo], int(np.count_nonzero(used))


def _substep(length: int) -> int:
    """Sub-block length of a scan along ``length``: 1 up to :data:`SEQUENTIAL_SCAN`, else ~``sqrt(length)``."""
    return 1 if length <= SEQUENTIAL_SCAN else 1 << (length.bit_length() // 2)


def _cumsum(x: np.ndarray | None, out: np.ndarray, step: int) -> None:
    """Cumulative sums along rows of ``x`` (``None``: ``out`` in place) into ``out`` (contiguous
    for ``step > 1``), in two stages for ``step > 1``: within blocks of ``step``, then block carries."""
    if x is None:  # in place
        x = out
    rows, length = x.shape
    if step == 1:
        np.cumsum(x, axis=1, out=out)
        return
    inner = out.reshape(rows, length // step, step)
    np.cumsum(x.reshape(rows, length // step, step), axis=2, out=inner)
    inner[:, 1:, :] += np.cumsum(inner[:, :-1, -1], axis=1)[:, :, None]


def _geometric_suffix(x: np.ndarray, r: float, out: np.ndarray) -> None:
    """``out[:, t] = sum_{s >= t} x[:, s] r^(s - t)`` along rows: an up-sweep of pairwise weighted
    totals, then a down-sweep giving each node the suffix from its start (O(L))."""
    rows, length = x.shape
    width = 1 << max(0, (length - 1).bit_length())
    level = np.zeros((rows, width))
    level[:, :length] = x
    totals = [level]
    while level.shape[1] > 1:
        half = r ** (width // level.shape[1])  # r^(node length): from a left node's start to its sibling's
        level = level[:, 0::2] + half * level[:, 1::2]
        totals.append(level)
    suffix = totals.pop()
    while totals:  # node c of one level -> its children 2c, 2c + 1 (levels freed on the way down)
        child = totals.pop()
        span = r ** (width // child.shape[1])  # r^(child length): from a right child's start to the next node
        down = np.empty_like(child)
        down[:, 0::2] = suffix
        odd = down[:, 1::2]
        odd[:, :-1] = suffix[:, 1:]
        odd[:, -1] = 0.0
        odd *= span
        odd += child[:, 1::2]
        suffix = down
    out[...] = suffix[:, :length]


def _power(log_r: float, exponent: np.ndarray) -> np.ndarray:
    """``r^exponent`` (exactly 1 when ``r = 1``; ``0^0 = 1`` when ``r = 0``)."""
    if log_r == 0.0:
        return np.ones(exponent.shape[0])
    if log_r == -math.inf:
        return (exponent == 0).astype(np.float64)
    return np.exp(log_r * exponent)
