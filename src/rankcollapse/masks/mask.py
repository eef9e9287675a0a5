"""The :class:`Mask` type: ``M[i, j] = True`` iff token ``i`` attends to token ``j`` (spec.md §1),
kept as a CSR form (built from the structure, never through a dense matrix) and a
FlexAttention predicate ``mask_mod(b, h, q_idx, kv_idx)``.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import scipy.sparse as sp

from .._lazy import is_tensor
from ..errors import MaskError, RankCollapseError
from .._validate import check_device, check_int, check_tensor_storage
from ._build import interval_csr
from .rows import check_rows_allow_key, raise_empty

if TYPE_CHECKING:  # torch is imported when a tensor form is asked for: `mask describe` never needs it
    import torch

MaskMod = Callable[[Any, Any, "torch.Tensor", "torch.Tensor"], "torch.Tensor"]


def normalise_csr(csr: Any, n_tokens: int) -> sp.csr_array:
    """Canonical bool CSR ``(n_tokens, n_tokens)``; MaskError for another shape."""
    csr = sp.csr_array(csr, dtype=bool)
    csr.eliminate_zeros()
    csr.sum_duplicates()
    csr.sort_indices()
    if csr.shape != (n_tokens, n_tokens):
        raise MaskError(f"mask must be square {n_tokens}x{n_tokens}, got shape {csr.shape}")
    return csr


def as_bool_matrix(matrix: Any, error: type[RankCollapseError] = MaskError, what: str = "mask matrix") -> Any:
    """``matrix`` as a ``torch.bool`` tensor (same device) or a ``numpy.bool_`` array. A mask
    matrix (``what`` in messages) is boolean or 0/1 integers; floats (additive masks, attention
    weights) and sparse or meta tensors raise ``error``."""
    check_tensor_storage(matrix, "mask", error=error)  # scipy sparse is the sparse mask form
    if is_tensor(matrix):
        import torch  # already loaded: matrix is a tensor

        M = matrix.detach()
        if M.dtype != torch.bool:
            if M.is_floating_point() or M.is_complex() or not bool(((M == 0) | (M == 1)).all()):
                raise error(f"{what} must be boolean (or 0/1 integers), got dtype {M.dtype}")
            M = M.bool()
        return M
    arr = np.asarray(matrix)
    if arr.dtype != np.bool_:
        if not np.issubdtype(arr.dtype, np.integer) or not np.isin(arr, (0, 1)).all():
            raise error(f"{what} must be boolean (or 0/1 integers), got dtype {arr.dtype}")
        arr = arr.astype(bool)
    return arr


class Mask:
    """An attention mask on ``n_tokens`` tokens.

    Parameters
    ----------
    spec : canonical spec string (``NAME:key=value,...``) that rebuilds this mask.
    csr : boolean scipy sparse ``(N, N)``; checked for shape and empty rows.
    build_csr : zero-argument function returning the CSR form (rows guaranteed non-empty).
    mask_mod : FlexAttention predicate ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor``.
    intervals : (lo, hi) int arrays ``(N,)``: row ``i`` attends to keys ``lo[i] .. hi[i]``.
    closed_form : graph facts known in closed form (the keys of :func:`~.constructors.closed`).
    check_rows : refuse a row with no allowed key (the default); False only for a part of a
        composed mask, whose whole is checked (:func:`combine`, :func:`~.spec.parse_mask`).

    Raises :class:`MaskError` for a non-square matrix, ``N < 1``, intervals not of length
    ``N``, or an empty row (with ``check_rows``). Build one with :func:`parse_mask` or :func:`resolve_mask`.
    """

    def __init__(self, n_tokens: int, spec: str, *, csr: Any = None,
                 build_csr: Callable[[], sp.csr_array] | None = None,
                 intervals: tuple[np.ndarray, np.ndarray] | None = None, mask_mod: MaskMod | None = None,
                 closed_form: dict[str, Any] | None = None, check_rows: bool = True) -> None:
        self.n_tokens = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
        self.spec = spec
        # unstructured masks get an exact predicate backed by a lazily built lookup table
        self.mask_mod: MaskMod = mask_mod if mask_mod is not None else _lazy_lookup(self.to_csr)
        self._predicate_is_structural = mask_mod is not None
        self.closed_form = closed_form
        self.n_edges_hint: int | None = None
        self.intervals: tuple[np.ndarray, np.ndarray] | None = None  # (lo, hi) when built from them
        if intervals is not None:
            lo, hi = (np.asarray(a, dtype=np.int64) for a in intervals)
            if lo.shape != (self.n_tokens,) or hi.shape != (self.n_tokens,):
                raise MaskError(f"intervals must be two arrays of shape ({self.n_tokens},), "
                                f"got {lo.shape} and {hi.shape}")
            if check_rows:
                raise_empty(np.flatnonzero(hi < lo), spec)  # O(N), no CSR built
            self.intervals = (lo, hi)
            self.n_edges_hint = int(np.maximum(hi - lo + 1, 0).sum())
            build_csr = lambda: interval_csr(lo, hi, self.n_tokens)  # noqa: E731
        if (csr is None) == (build_csr is None):
            raise MaskError("give exactly one of csr=, build_csr= or intervals=")
        self._csr: sp.csr_array | None = None
        self._build_csr = build_csr
        if csr is not None:
            self._csr = normalise_csr(csr, self.n_tokens)
            if check_rows:
                check_rows_allow_key(self._csr, spec)
            self.n_edges_hint = int(self._csr.nnz)

    @property
    def is_built(self) -> bool:
        """True once the CSR form exists (its memory is already spent)."""
        return self._csr is not None

    def to_csr(self) -> sp.csr_array:
        """Boolean ``scipy.sparse.csr_array`` of shape ``(N, N)`` (cached, sorted indices)."""
        if self._csr is None:
            self._csr = normalise_csr(self._build_csr(), self.n_tokens)
        return self._csr

    def to_dense(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Dense ``torch.bool`` ``(N, N)`` on ``device`` (default CPU; ConfigError if not present)."""
        import torch

        if device is not None:  # a typed error, not torch's AssertionError, for a missing GPU
            device = check_device(device)
        if self._predicate_is_structural:
            idx = torch.arange(self.n_tokens, device=device)
            out = self.mask_mod(0, 0, idx[:, None], idx[None, :])
            return out.expand(self.n_tokens, self.n_tokens).to(torch.bool).contiguous()
        return torch.from_numpy(self.to_csr().toarray()).to(device=device)

    def to_numpy(self) -> np.ndarray:
        """Dense ``numpy.bool_`` array ``(N, N)`` built from the CSR form."""
        return self.to_csr().toarray()

    @property
    def n_edges(self) -> int:
        """Number of allowed (query, key) pairs, self-loops included (without the CSR when known)."""
        return self.n_edges_hint if self.n_edges_hint is not None else int(self.to_csr().nnz)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_tokens, self.n_tokens)

    @classmethod
    def from_dense(cls, matrix: Any, spec: str | None = None, *, check_rows: bool = True) -> "Mask":
        """Mask from a dense boolean (or 0/1) ``(N, N)`` tensor or array. Raises :class:`MaskError`
        for another shape or dtype (:func:`as_bool_matrix`) or an empty row (with ``check_rows``)."""
        arr = as_bool_matrix(matrix)
        arr = arr.cpu().numpy() if is_tensor(arr) else arr
        if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
            raise MaskError(f"mask matrix must be square 2-D (N, N), got shape {tuple(arr.shape)}")
        n = check_int(arr.shape[0], "mask size", low=1, error=MaskError)
        return cls(n, spec or f"dense:n={n}", csr=sp.csr_array(arr), check_rows=check_rows)

    @classmethod
    def from_csr(cls, csr: Any, spec: str | None = None) -> "Mask":
        """Mask from any scipy sparse matrix/array of shape ``(N, N)`` (nonzero = allowed)."""
        if not sp.issparse(csr) or len(csr.shape) != 2 or csr.shape[0] != csr.shape[1]:
            raise MaskError(f"expected a square scipy sparse matrix, got {type(csr).__name__}")
        n = check_int(csr.shape[0], "mask size", low=1, error=MaskError)
        return cls(n, spec or f"sparse:n={n}", csr=csr)

    @classmethod
    def from_edges(cls, edges: Any, n_tokens: int, spec: str | None = None, *,
                   check_rows: bool = True) -> "Mask":
        """Mask from an ``(E, 2)`` integer array of ``(i, j)`` pairs meaning i attends to j. Raises
        :class:`MaskError` for a bad shape, ``n_tokens < 1``, an index outside ``0..N-1``, an empty
        row (with ``check_rows``)."""
        n = check_int(n_tokens, "n_tokens", low=1, error=MaskError)
        e = np.asarray(edges)
        if e.size == 0:
            e = e.reshape(0, 2)
        if e.ndim != 2 or e.shape[1] != 2 or not np.issubdtype(e.dtype, np.integer):
            raise MaskError(f"edge list must be integer pairs (E, 2), got shape {e.shape}, dtype {e.dtype}")
        bad = np.flatnonzero((e < 0).any(1) | (e >= n).any(1))
        if bad.size:
            i, j = e[bad[0]]
            raise MaskError(f"edge {bad[0]} ({i} {j}) names a token outside 0..{n - 1}")
        coo = sp.coo_array((np.ones(len(e), bool), (e[:, 0], e[:, 1])), shape=(n, n))
        return cls(n, spec or f"edges:n={n}", csr=coo.tocsr(), check_rows=check_rows)

    def __and__(self, other: "Mask") -> "Mask":
        return combine(self, other, "&")

    def __or__(self, other: "Mask") -> "Mask":
        return combine(self, other, "|")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mask):
            return NotImplemented
        if self.n_tokens != other.n_tokens:
            return False
        a, b = self.to_csr(), other.to_csr()
        return a.nnz == b.nnz and (a != b).nnz == 0

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Mask({self.spec!r}, n_tokens={self.n_tokens})"


def lazy_table(get_array: Callable[[], np.ndarray]) -> Callable[[Any], "torch.Tensor"]:
    """``table(device)``: the tensor of ``get_array()`` on ``device``, made on first use and kept."""
    cache: list = []

    def table(device: Any) -> "torch.Tensor":
        if not cache:
            import torch

            cache.append(torch.from_numpy(np.ascontiguousarray(get_array())))
        return cache[0].to(device)

    return table


def _lazy_lookup(get_csr: Callable[[], sp.csr_array]) -> MaskMod:
    """Exact predicate for an unstructured mask: a dense lookup table (N^2 bytes) built on first use."""
    table = lazy_table(lambda: get_csr().toarray())

    def mask_mod(b, h, q_idx, kv_idx):
        return table(q_idx.device)[q_idx, kv_idx]

    return mask_mod


def combine(a: Mask, b: Mask, op: str, *, check_rows: bool = True) -> Mask:
    """``a & b`` (``op="&"``) or ``a | b`` (``op="|"``); ``check_rows=False`` leaves an empty row
    to the caller, which checks the whole it composes (a union may fill the row)."""
    if not isinstance(b, Mask):
        return NotImplemented
    if a.n_tokens != b.n_tokens:
        raise MaskError(f"cannot combine masks of {a.n_tokens} and {b.n_tokens} tokens")
    csr = _intersect(a, b) if op == "&" else a.to_csr() + b.to_csr()
    join = operator.and_ if op == "&" else operator.or_
    mod = None
    if a._predicate_is_structural and b._predicate_is_structural:
        ma, mb = a.mask_mod, b.mask_mod

        def mod(bb, h, q, kv):
            return join(ma(bb, h, q, kv), mb(bb, h, q, kv))
    sa, sb = (_grouped(m.spec) if op == "&" else m.spec for m in (a, b))
    return Mask(a.n_tokens, f"{sa}{op}{sb}", csr=csr, mask_mod=mod, check_rows=check_rows)


def _grouped(spec: str) -> str:
    """``spec`` in parentheses if it has a top-level ``|`` (``&`` binds tighter)."""
    depth = 0
    for ch in spec:
        depth += (ch == "(") - (ch == ")")
        if ch == "|" and depth == 0:
            return f"({spec})"
    return spec


def _intersect(a: Mask, b: Mask, chunk: int = 1 << 22) -> sp.csr_array:
    """CSR of ``a & b``: the sparser operand's entries filtered by the other's predicate."""
    size_a, size_b = (float("inf") if m.n_edges_hint is None else m.n_edges_hint for m in (a, b))
    base, other = (a, b) if size_a <= size_b else (b, a)
    if not other._predicate_is_structural:
        return base.to_csr().multiply(other.to_csr())
    csr = base.to_csr()
    rows = np.repeat(np.arange(base.n_tokens, dtype=np.int64), np.diff(csr.indptr))
    keep = np.empty(csr.nnz, dtype=bool)
    import torch  # the predicates take tensors

    for s in range(0, csr.nnz, chunk):  # bounded temporary memory
        q = torch.from_numpy(rows[s : s + chunk])
        kv = torch.from_numpy(csr.indices[s : s + chunk].astype(np.int64))
        keep[s : s + chunk] = other.mask_mod(0, 0, q, kv).numpy()
    indptr = np.zeros(base.n_tokens + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows[keep], minlength=base.n_tokens), out=indptr[1:])
    return sp.csr_array((np.ones(int(keep.sum()), dtype=bool), csr.indices[keep], indptr),
                        shape=csr.shape)
