"""Sparse-attention patterns from the literature, random graphs and masks from files; each
takes ``n_tokens`` (N >= 1) first and states its key set ``K(i) = {j : M[i, j]}`` (0-based).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import MaskError, excerpt
from ._build import COO_BYTES_PER_EDGE, check_edges, columns_coo, interval_coo, progressions, rows_coo, union_csr
from .._io import load_npy
from .._validate import check_int
from .constructors import _rooted, closed, sliding_window
from .mask import Mask, lazy_table


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


def from_file(path: str | Path, n_tokens: int) -> Mask:
    """Mask read from a ``.npy`` boolean ``(N, N)`` matrix, or a text edge list of ``i j``
    lines (token i attends to token j; ``#`` comments). Raises :class:`MaskError` for an
    unreadable file, a non-square or non-boolean matrix, N other than ``n_tokens``, a malformed
    line, a token outside ``0..n_tokens-1``, or an empty row.
    """
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
    path = Path(path)
    spec = f"file:{path}"
    if not path.is_file():
        raise MaskError(f"mask file {str(path)!r} does not exist or is not a file")
    if path.suffix == ".npy":
        arr = load_npy(path, "mask file", error=MaskError)
        if arr.dtype != np.bool_:
            raise MaskError(f"mask file {str(path)!r} must hold a boolean matrix, got dtype {arr.dtype}")
        if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
            raise MaskError(f"mask file {str(path)!r} must hold a square (N, N) matrix, got shape {arr.shape}")
        if arr.shape[0] != n:
            raise MaskError(f"is {n}, but mask file {str(path)!r} has N={arr.shape[0]} tokens", argument="n_tokens")
        return Mask.from_dense(arr, spec=spec)
    return Mask.from_edges(_read_edge_list(path, n), n, spec=spec)


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
