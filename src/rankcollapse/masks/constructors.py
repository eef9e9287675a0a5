"""Mask constructors: each takes ``n_tokens`` (N >= 1) first and states the key set
``K(i) = {j : M[i, j]}`` (0-based). Local and causal masks also give a FlexAttention predicate and
closed-form graph facts; then sparse-attention patterns from the literature, random graphs and
masks from files."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import MaskError, excerpt
from ._build import COO_BYTES_PER_EDGE, check_edges, columns_coo, interval_coo, progressions, rows_coo, union_csr
from .._io import load_npy
from .._validate import check_int
from .mask import Mask, as_bool_matrix, lazy_table


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


def strided(n_tokens: int, stride: int) -> Mask:
    """Sparse Transformer *strided* pattern, both heads merged (Child et al. 2019 §4.2):
    ``K(i) = {j : max(0, i - l) <= j <= i} ∪ {j <= i : (i - j) mod l = 0}``, ``l = stride``.
    Raises :class:`MaskError` for ``stride < 1``."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    l = check_int(stride, "strided stride", low=1, error=MaskError)
    idx = np.arange(n)
    far = l >= 2 and n - 1 > l
    r = 2 if far else int(n > 1)
    return Mask(n, f"strided:stride={l}",
                build_csr=lambda: union_csr([interval_coo(np.maximum(idx - l, 0), idx),
                                             progressions(idx, -l, idx // l + 1)], n),
                mask_mod=lambda b, h, q, kv: (kv <= q) & ((q - kv <= l) | ((q - kv) % l == 0)),
                closed_form=_rooted(n, r))


def fixed(n_tokens: int, stride: int, c: int = 1) -> Mask:
    """Sparse Transformer *fixed* pattern, both heads merged (Child et al. 2019 §4.2):
    ``K(i) = {j <= i : j // l = i // l} ∪ {j <= i : j mod l >= l - c}``, ``l = stride``.
    Raises :class:`MaskError` for ``stride < 1`` or ``c`` outside ``1..stride``."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    l = check_int(stride, "fixed stride", low=1, error=MaskError)
    c = check_int(c, "fixed summary width c", low=1, error=MaskError)
    if c > l:
        raise MaskError(f"fixed summary width c={c} must be <= stride={l}")
    idx = np.arange(n)
    pieces = [interval_coo((idx // l) * l, idx)]
    for off in range(l - c, l):  # one progression per summary offset (c of them)
        pieces.append(progressions(np.full(n, off), l, np.maximum((idx - off) // l + 1, 0)))
    r = 0 if n == 1 else (1 if n <= l or c == l else 2)
    return Mask(n, f"fixed:stride={l},c={c}", build_csr=lambda: union_csr(pieces, n),
                mask_mod=lambda b, h, q, kv: (kv <= q) & ((kv // l == q // l) | (kv % l >= l - c)),
                closed_form=_rooted(n, r))


def _check_globals(globals_: Sequence[int], n: int, name: str) -> np.ndarray:
    g = np.asarray([check_int(x, f"{name} global token", low=0, error=MaskError) for x in globals_], dtype=np.int64)
    if g.size and g.max() >= n:
        raise MaskError(f"{name} global token {int(g.max())} is outside 0..{n - 1}")
    if np.unique(g).size != g.size:
        raise MaskError(f"{name} global tokens {g.tolist()} contain duplicates")
    return np.sort(g)


def _window_with_globals(n: int, w: int, g: np.ndarray) -> tuple[list, Mask]:
    """COO pieces of the window ``w`` (checked by :func:`sliding_window`, also returned) and the globals ``g``."""
    base = sliding_window(n, w)
    h = (w - 1) // 2
    idx = np.arange(n)
    return [interval_coo(np.maximum(idx - h, 0), np.minimum(idx + h, n - 1)), columns_coo(n, g), rows_coo(n, g)], base


def longformer(n_tokens: int, w: int, globals: Sequence[int] = ()) -> Mask:
    """Longformer (Beltagy et al. 2020 §3.1): window of odd width ``w = 2h + 1`` plus global
    tokens ``G``: ``K(i) = {j : |i - j| <= h} ∪ G`` for ``i ∉ G``, ``K(g) = {0..N-1}``.
    Raises :class:`MaskError` for a bad ``w``, or a global token outside ``0..N-1`` or repeated."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    g = _check_globals(globals, n, "longformer")
    pieces, base = _window_with_globals(n, w, g)
    is_g = np.zeros(n, dtype=bool)
    is_g[g] = True
    g_t = lazy_table(lambda: is_g)
    h = (w - 1) // 2
    if g.size and n > 1:
        rest = np.setdiff1d(np.arange(n), g)
        diam = 2 if rest.size and rest.max() - rest.min() > h else 1
        cf = closed(n, centers=np.arange(n), radius=1, strongly=True, diameter=diam)
    else:
        cf = base.closed_form
    return Mask(n, f"longformer:w={w},globals={'+'.join(map(str, g.tolist()))}", build_csr=lambda: union_csr(pieces, n),
                mask_mod=lambda b, hh, q, kv: ((q - kv).abs() <= h) | g_t(q.device)[q] | g_t(q.device)[kv],
                closed_form=cf)


def _distinct_random_keys(rng: np.random.Generator, n: int, r: int) -> np.ndarray:
    """``(n, r)`` keys, each row ``r`` distinct uniform tokens."""
    if r * r > n:  # many collisions expected: exact per-row permutation of an (n, n) array
        check_edges(n * n, n, 16)
        return np.argsort(rng.random((n, n)), axis=1)[:, :r]
    keys = rng.integers(0, n, size=(n, r))
    while True:
        s = np.sort(keys, axis=1)
        dup = (s[:, 1:] == s[:, :-1]).any(axis=1)
        if not dup.any():
            return keys
        keys[dup] = rng.integers(0, n, size=(int(dup.sum()), r))


def bigbird(n_tokens: int, w: int, globals: Sequence[int] = (), random: int = 0, seed: int = 0) -> Mask:
    """BigBird (Zaheer et al. 2020 §2, token level): :func:`longformer`'s keys plus ``R(i)``,
    ``random`` distinct tokens per query drawn with ``numpy.random.default_rng(seed)``.
    Raises :class:`MaskError` as :func:`longformer`, or for ``random`` < 0 or > N."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    g = _check_globals(globals, n, "bigbird")
    r = check_int(random, "bigbird random", low=0, error=MaskError)
    if r > n:
        raise MaskError(f"bigbird random={r} exceeds the number of tokens N={n}")
    seed = check_int(seed, "seed", low=0, error=MaskError)
    pieces, base = _window_with_globals(n, w, g)
    if r:
        keys = _distinct_random_keys(np.random.default_rng(seed), n, r)
        pieces.append((np.repeat(np.arange(n), r), keys.ravel()))
    if g.size and n > 1:
        cf = closed(n, centers=np.arange(n), radius=1, strongly=True)
        del cf["diameter"]  # depends on the random keys
    else:
        cf = base.closed_form if r == 0 else None
    csr = union_csr(pieces, n)
    spec = f"bigbird:w={w},globals={'+'.join(map(str, g.tolist()))},random={r},seed={seed}"
    return Mask(n, spec, csr=csr, closed_form=cf)


def random(n_tokens: int, p: float, seed: int = 0) -> Mask:
    """Erdős–Rényi directed graph ``G(N, p)`` plus self-loops, in O(E): a Binomial(N(N-1), p)
    count of distinct off-diagonal pairs (``numpy.random.default_rng(seed)``).
    Raises :class:`MaskError` for ``p`` outside ``[0, 1]``."""
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    if not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0 or math.isnan(p):
        raise MaskError(f"random edge probability p must be in [0, 1], got {p!r}")
    seed = check_int(seed, "seed", low=0, error=MaskError)
    rng = np.random.default_rng(seed)
    pairs = n * (n - 1)
    k = int(rng.binomial(pairs, p)) if pairs else 0
    check_edges(k + n, n, COO_BYTES_PER_EDGE)
    flat = rng.choice(pairs, size=k, replace=False) if k else np.zeros(0, dtype=np.int64)
    rows, off = np.divmod(flat, max(n - 1, 1))
    cols = off + (off >= rows)  # skip the diagonal
    idx = np.arange(n)
    csr = union_csr([(rows, cols), (idx, idx)], n)
    return Mask(n, f"random:p={p},seed={seed}", csr=csr)


def from_file(path: str | Path, n_tokens: int, *, check_rows: bool = True) -> Mask:
    """Mask read from a ``.npy`` boolean ``(N, N)`` matrix, or a text edge list of ``i j``
    lines (token i attends to token j; ``#`` comments). Raises :class:`MaskError` for an
    unreadable file, a non-square or non-boolean matrix, N other than ``n_tokens``, a malformed
    line, a token outside ``0..n_tokens-1``, or an empty row (with ``check_rows``; a part of a
    composed mask leaves it to the whole).
    """
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    path = Path(path)
    spec = f"file:{path}"
    if not path.is_file():
        raise MaskError(f"mask file {str(path)!r} does not exist or is not a file")
    if path.suffix == ".npy":
        arr = as_bool_matrix(load_npy(path, "mask file", error=MaskError), what=f"mask file {str(path)!r}")
        if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
            raise MaskError(f"mask file {str(path)!r} must hold a square (N, N) matrix, got shape {arr.shape}")
        if arr.shape[0] == 0:  # else reported as an N mismatch with the N=1 that _npy_rows asks for
            raise MaskError(f"mask file {str(path)!r} holds an empty (0, 0) matrix; a mask has N >= 1 tokens")
        if arr.shape[0] != n:
            raise MaskError(f"is {n}, but mask file {str(path)!r} has N={arr.shape[0]} tokens", argument="n_tokens")
        return Mask.from_dense(arr, spec=spec, check_rows=check_rows)
    return Mask.from_edges(_read_edge_list(path, n), n, spec=spec, check_rows=check_rows)


#: an ASCII decimal integer; str.isdigit would admit superscripts that int() rejects
_INTEGER = re.compile(r"[+-]?[0-9]+")


def _read_edge_list(path: Path, n: int) -> np.ndarray:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise MaskError(f"mask file {str(path)!r} is not readable text: {exc}") from None
    pairs = []
    for lineno, line in enumerate(lines, 1):
        body = line.split("#", 1)[0].split()
        if not body:
            continue
        if len(body) != 2 or not all(_INTEGER.fullmatch(x) for x in body):
            raise MaskError(f"mask file {str(path)!r} line {lineno}: expected two integers 'i j', got {excerpt(line.strip())}")
        i, j = int(body[0]), int(body[1])
        if not (0 <= i < n and 0 <= j < n):
            raise MaskError(f"mask file {str(path)!r} line {lineno}: edge '{i} {j}' names a token "
                            f"outside 0..{n - 1} (n_tokens={n})")
        pairs.append((i, j))
    return np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
