"""Vectorised CSR builders: a structured mask is a union, per query row, of arithmetic
progressions of keys, built in O(E) without the ``N x N`` matrix. Each builder counts its
edges before it allocates and refuses a mask over the memory limit (:func:`check_edges`)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .._memory import check_memory

#: Peak bytes per edge while COO pieces become a CSR: int64 rows, cols and offsets of a
#: piece, their concatenation over pieces, then the CSR's indices and data.
COO_BYTES_PER_EDGE = 48
#: Bytes per edge of the direct interval CSR (indices, their shifts, boolean data).
CSR_BYTES_PER_EDGE = 17


def check_edges(n_edges: int, n: int, bytes_per_edge: int) -> None:
    """Raise :class:`MemoryLimitError` when ``n_edges`` edges of an ``(n, n)`` mask need more
    than :func:`rankcollapse._memory.default_limit` to build."""
    check_memory(float(n_edges) * bytes_per_edge, f"building a mask on N = {n} tokens with {int(n_edges):,} edges",
                 adjustable=False)


def progressions(first: np.ndarray, step: int, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """COO rows/cols (int64, rows sorted) of the keys ``first[i] + step * k``, ``0 <= k < count[i]``."""
    count = np.maximum(np.asarray(count, dtype=np.int64), 0)
    n = count.shape[0]
    check_edges(int(count.sum()), n, COO_BYTES_PER_EDGE)
    rows = np.repeat(np.arange(n, dtype=np.int64), count)
    starts = np.cumsum(count) - count
    k = np.arange(rows.shape[0], dtype=np.int64) - np.repeat(starts, count)
    cols = np.repeat(np.asarray(first, dtype=np.int64), count) + step * k
    return rows, cols


def interval_csr(lo: np.ndarray, hi: np.ndarray, n: int) -> sp.csr_array:
    """CSR whose row ``i`` holds the keys ``lo[i] .. hi[i]`` (inclusive), built directly
    (``indices[e] = e - indptr[i] + lo[i]``) in the narrowest index dtype."""
    lo = np.asarray(lo, dtype=np.int64)
    count = np.maximum(np.asarray(hi, dtype=np.int64) - lo + 1, 0)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(count, out=indptr[1:])
    check_edges(int(indptr[-1]), n, CSR_BYTES_PER_EDGE)
    dtype = np.int32 if max(n, int(indptr[-1])) < 2**31 - 1 else np.int64
    shift = np.repeat((indptr[:-1] - lo).astype(dtype), count)
    indices = np.arange(indptr[-1], dtype=dtype)
    indices -= shift
    data = np.ones(indices.shape[0], dtype=bool)
    csr = sp.csr_array((data, indices, indptr.astype(dtype)), shape=(n, n))
    csr.has_sorted_indices = True
    csr.has_canonical_format = True
    return csr


def union_csr(pieces: list[tuple[np.ndarray, np.ndarray]], n: int) -> sp.csr_array:
    """CSR of the union of COO ``(rows, cols)`` pieces (duplicates merged)."""
    rows = np.concatenate([p[0] for p in pieces])
    cols = np.concatenate([p[1] for p in pieces])
    coo = sp.coo_array((np.ones(rows.shape[0], dtype=bool), (rows, cols)), shape=(n, n))
    csr = coo.tocsr()
    csr.sum_duplicates()
    return csr


def interval_coo(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """COO rows/cols of the inclusive per-row intervals ``lo[i] .. hi[i]``."""
    lo = np.asarray(lo, dtype=np.int64)
    return progressions(lo, 1, np.asarray(hi, dtype=np.int64) - lo + 1)


def columns_coo(n: int, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """COO of every row attending to each of ``cols`` (global keys)."""
    cols = np.asarray(cols, dtype=np.int64)
    check_edges(n * cols.shape[0], n, COO_BYTES_PER_EDGE)
    rows = np.repeat(np.arange(n, dtype=np.int64), cols.shape[0])
    return rows, np.tile(cols, n)


def rows_coo(n: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """COO of each of ``rows`` attending to every key (global queries)."""
    rows = np.asarray(rows, dtype=np.int64)
    check_edges(n * rows.shape[0], n, COO_BYTES_PER_EDGE)
    return np.repeat(rows, n), np.tile(np.arange(n, dtype=np.int64), rows.shape[0])
