"""Accept a mask in any of its forms: the one adapter every subpackage uses.

Forms: a spec string (parsed by :func:`~rankcollapse.masks.parse_mask`, needs ``n``),
a :class:`~rankcollapse.masks.Mask` (or anything with ``to_dense``/``to_csr``), a bool
``(N, N)`` tensor or array (0/1 integers accepted), or a scipy sparse matrix.

- :func:`resolve_mask` validates once and serves the dense matrix, the CSR form or a
  :class:`Mask` on demand (the dense ``(N, N)`` matrix is built only when asked for),
  for the simulator and the theory;
- :func:`dense_mask` returns the bool tensor directly, for code that needs it at once
  (model interventions, graph metrics, which also accept a ``(B, N, N)`` batch).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from .._validate import check_device, check_tensor_storage
from ..errors import MaskError, RankCollapseError
from .mask import Mask
from .rows import check_rows_allow_key, raise_empty
from .spec import parse_mask


def _is_mask_like(source: Any) -> bool:
    return hasattr(source, "to_csr") and hasattr(source, "to_dense") and not isinstance(source, torch.Tensor)


def _parse(source: Any, n: int | None) -> Any:
    if isinstance(source, str):
        if n is None:
            raise MaskError(f"mask spec {source!r} needs the number of tokens n")
        return parse_mask(source, n)
    return source


def _as_bool_tensor(source: Any, error: type[RankCollapseError]) -> torch.Tensor:
    check_tensor_storage(source, "mask", error=error)  # scipy sparse is the sparse mask form
    M = source.detach() if isinstance(source, torch.Tensor) else torch.as_tensor(np.asarray(source))
    if M.dtype != torch.bool:
        if M.is_floating_point() or M.is_complex() or not bool(((M == 0) | (M == 1)).all()):
            raise error(f"mask matrix must be boolean (or 0/1 integers), got dtype {M.dtype}")
        M = M.bool()
    return M


def _check_shape(shape: tuple[int, ...], n: int, error: type[RankCollapseError], batch: int | None = None) -> None:
    ok = shape == (n, n) or (batch is not None and len(shape) == 3 and shape[1:] == (n, n) and shape[0] in (1, batch))
    if not ok:
        want = f"({n}, {n})" + (f" or ({batch}, {n}, {n})" if batch is not None else "")
        raise error(f"mask must have shape {want} for N={n} tokens, got {tuple(shape)}")


class MaskInput:
    """One mask validated for ``n`` tokens (square, bool, every row allows a key).

    Attributes
    ----------
    spec : str — canonical spec of a Mask/spec input, ``"custom"`` for a raw matrix.
    n_tokens : int; n_edges : int — allowed ``(query, key)`` pairs.
    """

    def __init__(self, source: Any, n: int | None = None):
        source = _parse(source, n)
        self._mask: Mask | None = None
        self._dense: torch.Tensor | None = None
        self._csr: sp.csr_array | None = None
        #: ``(lo, hi)`` row intervals of a window-like Mask (row i attends lo[i]..hi[i]),
        #: kept so that kernels never build the CSR form of N·w edges; else None.
        self.intervals: tuple[np.ndarray, np.ndarray] | None = None
        if _is_mask_like(source):
            self.spec = str(getattr(source, "spec", "custom"))
            self._mask = source if isinstance(source, Mask) else None
            self.intervals = getattr(source, "intervals", None)
            if self.intervals is None:
                self._csr = sp.csr_array(source.to_csr())
        elif sp.issparse(source):
            self.spec = "custom"
            self._csr = sp.csr_array(source).astype(bool)
            self._csr.eliminate_zeros()
        else:
            self.spec = "custom"
            self._dense = _as_bool_tensor(source, MaskError).cpu()
        if self.intervals is not None:
            self._init_intervals(n)
            return
        shape = tuple(self._csr.shape if self._csr is not None else self._dense.shape)
        _check_shape(shape, shape[0] if n is None else n, MaskError)
        self.n_tokens = int(shape[0])
        check_rows_allow_key(self._csr if self._csr is not None else self._dense, None if self.spec == "custom" else self.spec)
        self.n_edges = int(self._csr.nnz) if self._csr is not None else int(self._dense.sum())

    def _init_intervals(self, n: int | None) -> None:
        lo, hi = self.intervals
        size = int(lo.shape[0])
        _check_shape((size, size), size if n is None else n, MaskError)
        self.n_tokens = size
        counts = hi - lo + 1
        raise_empty(np.flatnonzero(counts <= 0), self.spec)
        self.n_edges = int(counts.sum())

    def dense(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Bool ``(N, N)`` on ``device`` (built from the CSR form on first use).

        Raises :class:`~rankcollapse.errors.ConfigError` for a device not present here."""
        if device is not None:
            device = check_device(device)
        if self._dense is None:
            self._dense = self._mask.to_dense() if self._mask is not None else torch.from_numpy(self._csr.toarray())
        return self._dense.to(device=device, dtype=torch.bool)

    def csr(self) -> sp.csr_array:
        """Bool ``scipy.sparse.csr_array`` ``(N, N)`` (no ``N^2`` memory for Mask inputs)."""
        if self._csr is None:
            self._csr = sp.csr_array(self._mask.to_csr()) if self._dense is None else sp.csr_array(self._dense.numpy())
        return self._csr

    def mask(self) -> Mask:
        """The :class:`Mask` (built from the matrix for raw inputs), e.g. for ``analyze``."""
        if self._mask is None:
            self._mask = Mask(self.n_tokens, self.spec if self.spec != "custom" else f"dense:n={self.n_tokens}",
                              csr=self.csr())
        return self._mask


def resolve_mask(source: Any, n: int | None = None) -> MaskInput:
    """Validate ``source`` (any form of the module docstring) as a mask on ``n`` tokens.

    ``n`` may be omitted for a matrix or Mask input (taken from its shape).

    Raises
    ------
    MaskError
        A spec without ``n``, a bad spec, a non-bool matrix, a shape other than
        ``(n, n)``, or a row with no allowed key.
    """
    return source if isinstance(source, MaskInput) and n in (None, source.n_tokens) else MaskInput(source, n)


def dense_mask(source: Any, n: int, *, batch: int | None = None, require_keys: bool = True,
               error: type[RankCollapseError] = MaskError) -> torch.Tensor:
    """Bool ``(n, n)`` tensor of a mask in any form (or ``(B, n, n)``, see ``batch``).

    Parameters
    ----------
    source : spec string, Mask, bool/0-1 tensor or array, or scipy sparse matrix.
    n : number of tokens.
    batch : if given, a 3-D tensor ``(batch, n, n)`` or ``(1, n, n)`` is accepted too.
    require_keys : check that every row allows a key (always :class:`MaskError`);
        graph metrics turn it off, since a graph may have nodes without in-edges.
    error : error type for a bad type or shape (a metric raises :class:`MetricError`).

    Raises
    ------
    error
        Non-bool matrix or wrong shape.
    MaskError
        Bad spec, or (with ``require_keys``) a row with no allowed key.
    """
    source = _parse(source, n)
    if isinstance(source, MaskInput):
        M = source.dense()
    elif _is_mask_like(source):
        M = source.to_dense()
    elif sp.issparse(source):
        M = torch.from_numpy(sp.csr_array(source).toarray() != 0)
    else:
        M = _as_bool_tensor(source, error)
    _check_shape(tuple(M.shape), n, error, batch)
    if require_keys:
        check_rows_allow_key(M, getattr(source, "spec", None))
    return M.bool()
