"""The one check that every row of a mask allows at least one key.

A row with no allowed key makes the masked softmax a softmax over nothing (spec.md §1);
every consumer (the :class:`~rankcollapse.masks.Mask` type, the dense and blocked
attention kernels, the theory's :class:`~rankcollapse.theory.AttentionSystem`) calls
:func:`check_rows_allow_key`, so the rule and its message are the same everywhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .._lazy import is_tensor
from ..errors import MaskError

_SHOWN = 10  # offending rows named in the message


def empty_rows(allowed: Any) -> np.ndarray:
    """Indices of the rows with no allowed key, int64 ``(k,)`` ascending.

    ``allowed``: a scipy sparse ``(N, N)`` matrix (nonzero = allowed; explicit zeros
    are not counted as keys), or a bool tensor/array ``(..., N, N)``; with leading
    batch dimensions a row is empty if it is empty in *any* batch entry.

    Raises
    ------
    MaskError
        ``allowed`` is not a square matrix (or batch of them) of bools or numbers.
    """
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
    """Raise :class:`MaskError` naming the rows of ``allowed`` with no allowed key.

    Parameters
    ----------
    allowed : scipy sparse ``(N, N)`` or bool tensor/array ``(..., N, N)`` (see
        :func:`empty_rows`); ``M[i, j]`` = token ``i`` attends to token ``j``.
    spec : the mask's spec, named in the message when given.

    Raises
    ------
    MaskError
        ``"mask 'SPEC': rows [i, ...] allow no key (softmax over nothing)"`` (the first
        ten rows, then how many more).
    """
    raise_empty(empty_rows(allowed), spec)


def raise_empty(empty: np.ndarray, spec: str | None = None) -> None:
    """Raise the :func:`check_rows_allow_key` error for the empty rows ``empty``
    (int ``(k,)``); do nothing when ``k = 0``. For callers that already know the key
    count of every row (``np.flatnonzero(counts == 0)``), e.g. from row intervals."""
    if empty.size:
        shown = empty[:_SHOWN].tolist()
        more = f" (and {empty.size - _SHOWN} more)" if empty.size > _SHOWN else ""
        where = f"mask {spec!r}" if spec else "mask"
        raise MaskError(f"{where}: rows {shown}{more} allow no key (softmax over nothing)")
