"""Local and causal masks: each takes ``n_tokens`` (N >= 1) first, states the key set
``K(i) = {j : M[i, j]}`` (0-based), gives a FlexAttention predicate and closed-form graph facts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import MaskError
from ._build import progressions, union_csr
from .._validate import check_int
from .mask import Mask, lazy_table


def closed(n_tokens: int, *, centers: Any, radius: int | None, strongly: bool,
           diameter: int | None = None) -> dict[str, Any]:
    """Closed-form graph facts; empty ``centers`` = not QSC."""
    centers = np.asarray(centers, dtype=np.int64)
    return {"quasi_strongly_connected": bool(centers.size), "strongly_connected": strongly,
            "centers": centers, "radius": radius, "diameter": diameter}


def _identity_like(n: int) -> dict[str, Any]:
    """Closed form of a mask whose only edges are self-loops."""
    one = n == 1
    return closed(n, centers=[0] if one else [], radius=0 if one else None, strongly=one,
                  diameter=0 if one else None)


def _rooted(n: int, radius: int) -> dict[str, Any]:
    """Closed form of a mask whose one center is token 0 (strongly connected only for N = 1)."""
    return closed(n, centers=[0], radius=radius, strongly=n == 1, diameter=0 if n == 1 else None)


def complete(n_tokens: int) -> Mask:
    """Full attention: ``K(i) = {0, ..., N-1}`` (Vaswani et al. 2017, encoder)."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    r = int(n > 1)
    return Mask(n, "complete", intervals=(np.zeros(n, dtype=np.int64), np.full(n, n - 1)),
                mask_mod=lambda b, h, q, kv: (q >= 0) & (kv >= 0),
                closed_form=closed(n, centers=np.arange(n), radius=r, strongly=True, diameter=r))


def causal(n_tokens: int) -> Mask:
    """Causal attention: ``K(i) = {0, ..., i}`` (Vaswani et al. 2017, decoder)."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    return Mask(n, "causal", intervals=(np.zeros(n, dtype=np.int64), np.arange(n)),
                mask_mod=lambda b, h, q, kv: kv <= q, closed_form=_rooted(n, int(n > 1)))


def sliding_window(n_tokens: int, w: int) -> Mask:
    """Bidirectional sliding window of odd width ``w = 2h + 1``: ``K(i) = {j : |i - j| <= h}``
    (Beltagy et al. 2020). Raises :class:`MaskError` for ``w`` even or < 1."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    w = check_int(w, "sliding_window width w", low=1, error=MaskError)
    if w % 2 == 0:
        raise MaskError(f"sliding_window width w must be odd (w = 2h+1, centred on the query), got {w}")
    h = (w - 1) // 2
    idx = np.arange(n)
    cf = _identity_like(n) if h == 0 else closed(
        n, centers=idx, radius=math.ceil(math.ceil((n - 1) / 2) / h), strongly=True,
        diameter=math.ceil((n - 1) / h))
    return Mask(n, f"sliding_window:w={w}",
                intervals=(np.maximum(idx - h, 0), np.minimum(idx + h, n - 1)),
                mask_mod=lambda b, hh, q, kv: (q - kv).abs() <= h, closed_form=cf)


def causal_sliding_window(n_tokens: int, w: int) -> Mask:
    """Causal sliding window of width ``w`` (the query and ``w - 1`` previous tokens):
    ``K(i) = {j : i - w + 1 <= j <= i}``, as Hugging Face ``sliding_window=w`` and Mistral.
    Raises :class:`MaskError` for ``w < 1``."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    w = check_int(w, "causal_sliding_window width w", low=1, error=MaskError)
    idx = np.arange(n)
    cf = _identity_like(n) if w == 1 else _rooted(n, math.ceil((n - 1) / (w - 1)))
    return Mask(n, f"causal_sliding_window:w={w}", intervals=(np.maximum(idx - w + 1, 0), idx),
                mask_mod=lambda b, h, q, kv: (kv <= q) & (q - kv < w), closed_form=cf)


def dilated(n_tokens: int, w: int, dilation: int, causal: bool = False) -> Mask:
    """Dilated sliding window (Beltagy et al. 2020 §3.1); not QSC for ``dilation > 1``, N > 1:
    ``causal=False`` (``w = 2h + 1`` odd): ``K(i) = {i + k*dilation : |k| <= h} ∩ [0, N)``;
    ``causal=True``: ``K(i) = {i - k*dilation : 0 <= k < w} ∩ [0, N)``.
    Raises :class:`MaskError` for ``w < 1``, ``dilation < 1``, or an even ``w`` with ``causal=False``.
    """
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    w = check_int(w, "dilated width w", low=1, error=MaskError)
    d = check_int(dilation, "dilation", low=1, error=MaskError)
    causal = bool(causal)
    base = (causal_sliding_window(n, w) if causal else sliding_window(n, w)) if d == 1 else None
    idx = np.arange(n)
    if causal:
        first, step, count = idx, -d, np.minimum(w, idx // d + 1)
    else:
        if w % 2 == 0:
            raise MaskError(f"dilated width w must be odd when causal=false, got {w}")
        h = (w - 1) // 2
        kmin, kmax = -np.minimum(h, idx // d), np.minimum(h, (n - 1 - idx) // d)
        first, step, count = idx + kmin * d, d, kmax - kmin + 1

    def mod(b, hh, q, kv):
        diff = q - kv
        ok = (diff % d == 0) & (diff.abs() <= d * ((w - 1) if causal else (w - 1) // 2))
        return ok & (kv <= q) if causal else ok

    cf = base.closed_form if base is not None else _identity_like(n) if n == 1 else closed(
        n, centers=[], radius=None, strongly=False)
    return Mask(n, f"dilated:w={w},dilation={d},causal={str(causal).lower()}",
                build_csr=lambda: union_csr([progressions(first, step, count)], n),
                mask_mod=mod, closed_form=cf)


def prefix(n_tokens: int, k: int) -> Mask:
    """Prefix-LM mask (Raffel et al. 2020): ``K(i) = {0, ..., max(i, k - 1)}``.
    Raises :class:`MaskError` for ``k < 1`` or ``k > N``."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    k = check_int(k, "prefix length k", low=1, error=MaskError)
    if k > n:
        raise MaskError(f"prefix length k={k} exceeds the number of tokens N={n}")
    r = int(n > 1)
    return Mask(n, f"prefix:k={k}",
                intervals=(np.zeros(n, dtype=np.int64), np.maximum(np.arange(n), k - 1)),
                mask_mod=lambda b, h, q, kv: (kv <= q) | (kv < k),
                closed_form=closed(n, centers=np.arange(k), radius=r, strongly=k == n,
                                   diameter=r if k == n else None))


def documents(n_tokens: int, lengths: list[int], causal: bool = False) -> Mask:
    """Packed documents of ``lengths`` tokens (sum N): ``K(i) = {j : doc(j) = doc(i)}``,
    and ``j <= i`` if ``causal`` (Krell et al. 2021).
    Raises :class:`MaskError` for an empty list, a length < 1, or lengths not summing to N."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    lengths = [check_int(x, "document length", low=1, error=MaskError) for x in lengths]
    if not lengths or sum(lengths) != n:
        raise MaskError(f"document lengths {lengths} sum to {sum(lengths)}, not N={n}")
    causal = bool(causal)
    spec = f"documents:lengths={'+'.join(map(str, lengths))},causal={str(causal).lower()}"
    return _blocks(n, lengths, causal, spec)


def block(n_tokens: int, size: int, causal: bool = False) -> Mask:
    """Block-local attention (Qiu et al. 2020): ``K(i) = {j : j // size = i // size}``, and
    ``j <= i`` if ``causal``. Raises :class:`MaskError` for ``size < 1``."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    size = check_int(size, "block size", low=1, error=MaskError)
    causal = bool(causal)
    lengths = [size] * (n // size) + ([n % size] if n % size else [])
    return _blocks(n, lengths, causal, f"block:size={size},causal={str(causal).lower()}")


def _blocks(n: int, lengths: list[int], is_causal: bool, spec: str) -> Mask:
    """Attention within consecutive blocks of ``lengths`` tokens (and ``j <= i`` if ``is_causal``)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    doc = np.repeat(np.arange(len(lengths)), lengths)
    idx = np.arange(n)
    lo = starts[doc]
    hi = idx if is_causal else ends[doc] - 1
    doc_t = lazy_table(lambda: doc.astype(np.int64))

    def mod(b, h, q, kv):
        d = doc_t(q.device)
        same = d[q] == d[kv]
        return same & (kv <= q) if is_causal else same

    if len(starts) == 1:
        cf = (causal(n) if is_causal else complete(n)).closed_form
    else:
        cf = closed(n, centers=[], radius=None, strongly=False)
    return Mask(n, spec, intervals=(lo, hi), mask_mod=mod, closed_form=cf)
