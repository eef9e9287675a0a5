"""Accept a mask in any of its forms and serve the dense matrix or the block plan.

Forms: a spec string (parsed by :func:`rankcollapse.masks.parse_mask`), a ``Mask``
(anything with ``to_dense``/``to_csr``), a bool ``(N, N)`` tensor or array, or a scipy
sparse matrix. The dense ``(N, N)`` matrix is built only when the dense path asks.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse
import torch

from ..errors import MaskError
from .sparse import BlockPlan


class ResolvedMask:
    """One mask, validated for ``n`` tokens (every row allows at least one key)."""

    def __init__(self, source, n: int):
        self.mask_obj = None
        self._dense = None
        self._csr = None
        self._intervals = None
        if isinstance(source, str):
            from ..masks import parse_mask

            source = parse_mask(source, n)
        if hasattr(source, "to_csr") and hasattr(source, "to_dense"):
            self.mask_obj = source
            self.spec = str(getattr(source, "spec", "custom"))
            if source.n_tokens != n:
                raise MaskError(f"mask {self.spec!r} is for {source.n_tokens} tokens, X0 has {n}")
            self._intervals = getattr(source, "intervals", None)
            if self._intervals is None:  # windows keep row intervals: no CSR of N w edges
                self._csr = scipy.sparse.csr_array(source.to_csr())
        elif scipy.sparse.issparse(source):
            self.spec = "custom"
            self._csr = scipy.sparse.csr_array(source).astype(bool)
        else:
            M = source if isinstance(source, torch.Tensor) else torch.as_tensor(np.asarray(source))
            if M.dtype != torch.bool:
                raise MaskError(f"mask matrix must be bool, got {M.dtype}")
            self.spec = "custom"
            self._dense = M.detach().cpu()
        if self._intervals is not None:
            lo, hi = self._intervals
            counts = hi - lo + 1
        else:
            shape = tuple(self._csr.shape if self._csr is not None else self._dense.shape)
            if shape != (n, n):
                raise MaskError(f"mask has shape {shape}, X0 has {n} tokens (expected ({n}, {n}))")
            counts = np.diff(self._csr.indptr) if self._csr is not None else self._dense.sum(1).numpy()
        empty = np.flatnonzero(counts == 0)
        if empty.size:
            raise MaskError(f"rows {empty[:10].tolist()} of the mask allow no key (softmax over nothing)")
        self.n_tokens = n
        self.n_edges = int(counts.sum())

    def dense(self, device) -> torch.Tensor:
        """Bool ``(N, N)`` on ``device``."""
        if self._dense is None:
            self._dense = self.mask_obj.to_dense() if self.mask_obj is not None else torch.as_tensor(
                self._csr.toarray())
        return self._dense.to(device=device, dtype=torch.bool)

    def flex(self, device):
        """:class:`~rankcollapse.dynamics.flex.FlexBackend` of this mask on ``device``."""
        from .flex import FlexBackend

        if self.mask_obj is None:
            from ..masks import Mask

            self.mask_obj = Mask.from_csr(self._csr) if self._csr is not None else Mask.from_dense(self._dense)
        return FlexBackend(self.mask_obj, device)

    def plan(self, block_size: int, device) -> BlockPlan:
        """:class:`BlockPlan` built from the row intervals or the CSR form (no ``N^2``
        memory for Mask inputs)."""
        if self._intervals is not None:
            return BlockPlan(intervals=self._intervals, block_size=block_size, device=device)
        csr = self._csr if self._csr is not None else scipy.sparse.csr_array(self._dense.numpy())
        return BlockPlan(csr, block_size=block_size, device=device)


def resolve_mask(source, n: int) -> ResolvedMask:
    """Validate ``source`` as a mask on ``n`` tokens (see module docstring).

    Raises
    ------
    MaskError
        Wrong shape, non-bool matrix, a row with no allowed key, bad spec.
    """
    return ResolvedMask(source, n)
