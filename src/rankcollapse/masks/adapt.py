"""Accept a mask in any of its forms (docs/masks.md, "One mask type for every mask form"):
a spec string (needs ``n_tokens``), a :class:`~rankcollapse.masks.Mask`, a bool or 0/1
``(N, N)`` tensor or array, or a scipy sparse matrix. :func:`resolve_mask` returns a Mask,
:func:`dense_mask` a bool tensor."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .._lazy import is_tensor
from ..errors import MaskError, RankCollapseError
from .mask import Mask, as_bool_matrix
from .rows import check_rows_allow_key
from .spec import parse_mask


def _check_shape(shape: tuple[int, ...], n: int, error: type[RankCollapseError], batch: int | None = None) -> None:
    ok = shape == (n, n) or (batch is not None and len(shape) == 3 and shape[1:] == (n, n) and shape[0] in (1, batch))
    if not ok:
        want = f"({n}, {n})" + (f" or ({batch}, {n}, {n})" if batch is not None else "")
        raise error(f"mask must have shape {want} for N={n} tokens, got {tuple(shape)}")


def _spec_mask(spec: str, n: int | None) -> Mask:
    if n is None:
        raise MaskError(f"mask spec {spec!r} needs the number of tokens n_tokens")
    return parse_mask(spec, n)


def resolve_mask(source: Any, n_tokens: int | None = None) -> Mask:
    """``source`` (any form of the module docstring) as a :class:`Mask` on ``n_tokens`` tokens.

    A Mask is returned itself; a matrix becomes ``Mask.from_dense`` (spec ``dense:n=N``) or
    ``Mask.from_csr`` (``sparse:n=N``). ``n_tokens`` may be omitted for a matrix or Mask.

    Raises :class:`MaskError` for a spec without ``n_tokens``, a bad spec, a matrix that is not
    boolean (or 0/1), a sparse or meta tensor, a shape other than ``(n_tokens, n_tokens)``, an empty row.

    See Also
    --------
    parse_mask : the spec strings.
    Mask.from_dense, Mask.from_csr : the matrix forms.
    dense_mask : a bool tensor instead of a Mask (batches, graphs without in-edges).

    Examples
    --------
    >>> import numpy as np
    >>> resolve_mask("causal", 4)
    Mask('causal', n_tokens=4)
    >>> m = resolve_mask(np.tril(np.ones((3, 3), dtype=bool)))
    >>> m.spec, m.n_edges
    ('dense:n=3', 6)
    >>> resolve_mask(m, 3) is m
    True
    """
    if isinstance(source, str):
        return _spec_mask(source, n_tokens)
    if isinstance(source, Mask):
        mask = source
    else:
        if n_tokens is not None and (sp.issparse(source) or is_tensor(source) or isinstance(source, np.ndarray)):
            _check_shape(tuple(source.shape), n_tokens, MaskError)  # before any conversion
        mask = Mask.from_csr(source) if sp.issparse(source) else Mask.from_dense(source)
    if n_tokens is not None:
        _check_shape(mask.shape, n_tokens, MaskError)
    return mask


def dense_mask(source: Any, n_tokens: int, *, n_samples: int | None = None, require_keys: bool = True,
               error: type[RankCollapseError] = MaskError) -> Any:
    """Bool ``(N, N)`` ``torch`` tensor of a mask in any form; with ``n_samples`` (the ``B`` of tokens
    ``(B, N, d)``) a ``(B, N, N)`` or ``(1, N, N)`` tensor is accepted too. ``require_keys``: check that
    every row allows a key (off for graphs without in-edges). A non-bool matrix or a wrong shape
    raises ``error`` (a metric's :class:`MetricError`); a bad spec or an empty row :class:`MaskError`.
    """
    import torch

    if isinstance(source, str):
        source = _spec_mask(source, n_tokens)
    if isinstance(source, Mask):
        M = source.to_dense()
    elif sp.issparse(source):
        M = torch.from_numpy(sp.csr_array(source).toarray() != 0)
    else:
        M = as_bool_matrix(source, error)
        M = M if is_tensor(M) else torch.from_numpy(M)
    _check_shape(tuple(M.shape), n_tokens, error, n_samples)
    if require_keys:
        check_rows_allow_key(M, getattr(source, "spec", None))
    return M
