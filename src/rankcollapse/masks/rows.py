"""The one check that every row of a mask allows at least one key (else the masked softmax
is over nothing, spec.md §1); every consumer calls :func:`check_rows_allow_key`."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .._lazy import is_tensor
from ..errors import MaskError

_SHOWN = 10  # offending rows named in the message


def empty_rows(allowed: Any) -> np.ndarray:
    """Indices (int64, ascending) of the rows with no allowed key of a scipy sparse ``(N, N)``
    (nonzero = allowed) or a bool tensor/array ``(..., N, N)`` (empty in *any* batch entry).
    Raises :class:`MaskError` when ``allowed`` is not a square matrix (or batch) of numbers."""
    if sp.issparse(allowed):
        csr = sp.csr_array(allowed)
        counts = np.diff(csr.indptr) if csr.nnz == csr.count_nonzero() else (csr != 0).sum(axis=1)
        return np.flatnonzero(np.asarray(counts).ravel() == 0)
    if is_tensor(allowed):
        import torch

        empty = ~allowed.bool().any(dim=-1)  # (..., N)
        if not bool(empty.any()):  # the common case: one reduction and one host sync
            return np.zeros(0, dtype=np.int64)
        return torch.nonzero(empty.reshape(-1, empty.shape[-1]).any(0)).flatten().cpu().numpy()
    arr = np.asarray(allowed) if allowed is not None else np.zeros(0)
    if arr.ndim < 2 or arr.shape[-1] != arr.shape[-2] or arr.dtype.kind not in "biuf":
        raise MaskError(f"a mask matrix is a bool (N, N) or (..., N, N) matrix, got "
                        f"{type(allowed).__name__} of shape {arr.shape} and dtype {arr.dtype}")
    arr = arr.astype(bool)
    return np.flatnonzero((~arr.any(axis=-1)).reshape(-1, arr.shape[-1]).any(0))


def check_rows_allow_key(allowed: Any, spec: str | None = None) -> None:
    """Raise :class:`MaskError` ``"mask 'SPEC': rows [i, ...] allow no key (softmax over
    nothing)"`` for the empty rows of ``allowed`` (forms: :func:`empty_rows`)."""
    raise_empty(empty_rows(allowed), spec)


def raise_empty(empty: np.ndarray, spec: str | None = None) -> None:
    """Raise the :func:`check_rows_allow_key` error for the empty rows ``empty`` (if any)."""
    if empty.size:
        shown = empty[:_SHOWN].tolist()
        more = f" (and {empty.size - _SHOWN} more)" if empty.size > _SHOWN else ""
        where = f"mask {spec!r}" if spec else "mask"
        raise MaskError(f"{where}: rows {shown}{more} allow no key (softmax over nothing)")
