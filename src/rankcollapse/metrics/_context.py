"""Input checking, padding-aware grouping and the intermediates metrics share.

Every metric is a function ``fn(ctx) -> (G,)`` of a :class:`MetricContext` that holds
the *real* tokens of ``G`` samples sharing one length ``L`` as a dense ``(G, L, d)``
tensor. A padded batch is split into one context per distinct length (a Python loop
over lengths, never over samples), so a padded sample gives exactly the numbers of
its unpadded rows: N-dependent normalisations (``min(N, d)``, mean-centring, the
``1/(N(N-1))`` of pair averages) all see ``L``, not the padded length.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import torch

from .._validate import check_tensor_storage
from ..errors import MetricError
from ..masks.adapt import dense_mask

MetricFn = Callable[["MetricContext"], torch.Tensor]
PAIR_BUDGET = 64 * 2**20  # bytes of a (G, L, L) pair matrix above which pair sums avoid forming it


class ZeroRowWarning(UserWarning):
    """Some tokens are exactly zero and were left out of cosine-based averages."""


@dataclass(frozen=True)
class RankTolerance:
    """Numerical-rank threshold: ``atol`` if given, else ``rtol * sigma_1`` if given,
    else the larger of two stated error sources.

    1. **Error of the computation**: ``sigma_1 * max(N, d) * eps(compute dtype)``,
       numpy's ``matrix_rank`` rule. A backward-stable SVD returns the exact singular
       values of ``X + E`` with ``||E||_2 <= p(N, d) eps ||X||_2`` (Golub & Van Loan,
       Matrix Computations, 4th ed., §8.6.3), and numpy/Numerical Recipes (§2.6) take
       ``p = max(N, d)``. Half-precision input is computed in float32 (see
       :func:`as_batch`), so ``eps`` is never bfloat16's.
    2. **Noise floor of the storage** (``noise_floor=True``, the default): rounding
       the data to its own dtype moves each entry by at most ``u |x_ij|`` (unit
       roundoff ``u = eps / 2``), a perturbation with ``||E||_2 <= ||E||_F <= u ||X||_F``.
       By Weyl's inequality every singular value above ``u ||X||_F`` is non-zero in
       the unrounded data too, and one below it may be rounding alone. It only
       matters when the compute dtype is finer than the storage (float32 hidden
       states computed in float64); otherwise term 1 is always larger.
    """

    atol: float | None = None
    rtol: float | None = None
    noise_floor: bool = True

    def threshold(self, svals: torch.Tensor, n: int, d: int, frobenius: torch.Tensor, storage_eps: float = 0.0):
        """Per-sample threshold ``(G, 1)`` for singular values ``svals`` ``(G, k)`` of
        the normalised tokens (see :class:`MetricContext`); ``frobenius`` ``(G,)`` is
        their ``||X||_F`` and ``storage_eps`` the machine epsilon of the input's dtype."""
        if self.atol is not None:
            raise ValueError("atol is compared on the original scale; see _numerical_rank")
        if self.rtol is not None:
            return svals[..., :1] * self.rtol
        tol = svals[..., :1] * (max(n, d) * torch.finfo(svals.dtype).eps)
        if self.noise_floor and storage_eps > 0:
            tol = torch.maximum(tol, (0.5 * storage_eps) * frobenius.unsqueeze(-1).to(svals.dtype))
        return tol


class MetricContext:
    """Real tokens of the samples ``samples`` plus lazily cached intermediates
    (singular values, Gram matrices...) shared by all metrics of a call.

    ``X`` ``(G, L, d)`` holds each sample divided by ``scale`` ``(G,)``, a power of two
    near its largest absolute entry (so ``max |X| in [1, 2)``). The division is exact,
    so scale-invariant metrics computed from ``X`` are the same at every input scale
    over the dtype's normal range (no Gram entry, square or sum under/overflows);
    metrics that scale with X multiply their value by ``scale`` (``scale**2`` for
    squared quantities) at the end.

    ``normalise=False`` keeps ``X`` itself (no copy, ``scale = 1``), for metrics whose
    intermediates are the :func:`stable_norm` row norms, μ, the mean token and the unit
    rows (:data:`~rankcollapse.metrics.registry.UNSCALED_METRICS`): they cannot over- or
    underflow while every row norm is a normal number (unit rows are bounded by 1), and a
    power-of-two scale only moves their exponents, so the values are the same as with
    the copy. ``out``: an ``X``-shaped buffer the unit rows are written into (the
    caller's scratch, free once μ is computed).
    """

    def __init__(self, X, samples, graph, tolerance, batched, data_eps=0.0, *, normalise: bool = True,
                 out: torch.Tensor | None = None):
        self.X, self.scale = pow2_normalise(X) if normalise else (X, X.new_ones(X.shape[0]))
        self._out = out
        self.data_eps = data_eps  # eps of the input's own dtype (before any cast)
        self.samples = samples
        self.tolerance = tolerance
        self._graph = graph
        self._batched = batched
        self._cache: dict[str, object] = {}
        self.n_zero_rows = 0

    @property
    def n_tokens(self) -> int:
        return self.X.shape[-2]

    @property
    def dim(self) -> int:
        return self.X.shape[-1]

    def cached(self, key: str, make: Callable[[], object]):
        """Compute ``make()`` once per context."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def fail(self, bad: torch.Tensor, problem: str) -> None:
        """Raise :class:`MetricError` if any entry of the ``(G,)`` mask ``bad`` is set."""
        if bool(bad.any()):
            if not self._batched:
                raise MetricError(problem)
            idx = self.samples[bad].tolist()
            raise MetricError(f"{problem} (batch samples {idx[:10]}{'...' if len(idx) > 10 else ''})")

    # ---- shared intermediates -------------------------------------------------
    @property
    def svals(self) -> torch.Tensor:
        """Singular values ``(G, min(L, d))``, descending: one ``svdvals`` per context."""
        return self.cached("svals", lambda: svdvals_fast(self.X))

    @property
    def row_norms(self) -> torch.Tensor:
        """``||x_i||_2`` per token, ``(G, L)``."""
        return self.cached("row_norms", lambda: stable_norm(self.X, -1))

    @property
    def frobenius(self) -> torch.Tensor:
        """``||X||_F`` per sample, ``(G,)``."""
        return self.cached("fro", lambda: stable_norm(self.row_norms, -1))

    @property
    def mean_token(self) -> torch.Tensor:
        """``gamma_X = (1/L) 1^T X``, ``(G, d)``."""
        return self.cached("mean", lambda: self.X.mean(dim=-2))

    @property
    def centered(self) -> torch.Tensor:
        """``X - 1 gamma_X``, ``(G, L, d)``."""
        return self.cached("centered", lambda: self.X - self.mean_token.unsqueeze(-2))

    @property
    def centered_gram(self) -> torch.Tensor:
        """``(X - 1 gamma)(X - 1 gamma)^T``, ``(G, L, L)``."""
        return self.cached("cgram", lambda: self.centered @ self.centered.mT)

    @property
    def row_valid(self) -> torch.Tensor:
        """Bool ``(G, L)``: token is non-zero (zero tokens have no direction)."""
        return self.cached("valid", self._row_valid)

    def _row_valid(self) -> torch.Tensor:
        valid = self.row_norms > 0
        self.fail(~valid.any(dim=-1), "every token is zero: cosine similarity is undefined")
        self.n_zero_rows = int((~valid).sum())  # reported once per call by evaluate()
        return valid

    @property
    def inv_norms(self) -> torch.Tensor:
        """``1 / ||x_i||`` for non-zero tokens, 0 for zero tokens, ``(G, L)``."""
        valid = self.row_valid
        return self.cached("inv", lambda: torch.where(valid, self.row_norms, 1.0).reciprocal() * valid)

    @property
    def unit_rows(self) -> torch.Tensor:
        """``x_i / ||x_i||`` ``(G, L, d)``; zero tokens stay zero. The row norms come
        from :func:`stable_norm`, so tokens far smaller than the sample's largest stay
        exact (a Gram of X would square them below the dtype's range)."""
        return self.cached("unit", lambda: torch.mul(self.X, self.inv_norms.unsqueeze(-1), out=self._out))

    @property
    def cos(self) -> torch.Tensor:
        """Pairwise cosines ``(G, L, L)`` with the diagonal set to 0 (pairs i != j only);
        rows/columns of zero tokens are 0: the Gram of the unit rows."""

        def make():
            U = self.unit_rows
            C = U @ U.mT
            C.diagonal(dim1=-2, dim2=-1).zero_()
            return C

        return self.cached("cos", make)

    def _pairs_fit(self) -> bool:
        G, L, _ = self.X.shape
        return G * L * L * self.X.element_size() <= PAIR_BUDGET

    def cos_pair_sum(self) -> torch.Tensor:
        """``sum_{i != j} cos(x_i, x_j)`` over non-zero tokens, ``(G,)``.

        Small L: the sum of :attr:`cos`. Large L (the ``(G, L, L)`` matrix over
        :data:`PAIR_BUDGET`): the d-dimensional form ``||sum_i u_i||^2 - sum_i ||u_i||^2``
        with ``u_i`` the unit tokens (expand the square), O(L d) time and memory."""
        if self._pairs_fit():
            return self.cos.sum(dim=(-2, -1))
        u = self.unit_rows
        return u.sum(dim=-2).square().sum(dim=-1) - u.square().sum(dim=(-2, -1))

    def abs_cos_pair_sum(self) -> torch.Tensor:
        """``sum_{i != j} |cos(x_i, x_j)|`` over non-zero tokens, ``(G,)``.

        |cos| has no low-dimensional form; for large L the pairs are summed in row
        chunks of the upper triangle (``|C|`` is symmetric: off-diagonal chunks count
        twice), memory ``O(PAIR_BUDGET)``, time ``L^2 d``."""
        if self._pairs_fit():
            return self.cos.abs().sum(dim=(-2, -1))
        u = self.unit_rows
        G, L, _ = u.shape
        rows = max(1, PAIR_BUDGET // (2 * G * L * u.element_size()))
        total = u.new_zeros(G)
        for a in range(0, L, rows):  # chunks of rows, not tokens: L / rows iterations
            b = min(L, a + rows)
            block = (u[:, a:b] @ u[:, a:].mT).abs_()  # (G, b - a, L - a): pairs (i, j >= a)
            diag = block[:, :, : b - a].diagonal(dim1=-2, dim2=-1).sum(dim=-1)
            square = block[:, :, : b - a].sum(dim=(-2, -1))
            total += square - diag + 2.0 * block[:, :, b - a:].sum(dim=(-2, -1))
        return total

    @property
    def graph(self) -> torch.Tensor:
        """Edge weights ``(G or 1, L, L)`` (``1.0`` where token i attends to token j);
        the complete graph when no mask was given."""
        if self._graph is None:
            shape = (1, self.n_tokens, self.n_tokens)
            return self.cached("graph", lambda: torch.ones(shape, dtype=self.X.dtype, device=self.X.device))
        return self.cached("graph", lambda: self._graph.to(self.X.dtype))


def stable_norm(Y: torch.Tensor, dim) -> torch.Tensor:
    """``torch.linalg.vector_norm(Y, dim=dim)`` without overflow or underflow of the squares.

    float32 squares overflow for entries above ~1.8e19 (a finite X would get ``mu = inf``)
    and vanish below ~1e-19 (``mu = 0``). The plain norm is kept where it is safely
    inside the range; otherwise the slices are divided by a power of two near their
    largest absolute entry (exact) before squaring and the norm is scaled back, as
    LAPACK's ``xNRM2`` does (Blue 1978, "A portable Fortran program to find the
    Euclidean norm of a vector"). Costs one extra reduction and a ``(G,)`` host check.
    """
    r = torch.linalg.vector_norm(Y, dim=dim)
    info = torch.finfo(Y.dtype)
    low = math.sqrt(info.tiny) / info.eps  # below this, lost squares could matter
    if Y.numel() == 0 or bool((torch.isfinite(r) & (r >= low)).all()):
        return r
    peak = Y.abs().amax(dim=dim, keepdim=True)
    _, exponent = torch.frexp(peak)  # peak = m 2^e, 0.5 <= m < 1
    s = torch.where(peak > 0, torch.ldexp(torch.ones_like(peak), exponent - 1), 1.0)
    return torch.linalg.vector_norm(Y / s, dim=dim) * s.reshape(r.shape)


def pow2_normalise(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X / s, s)`` with ``s`` ``(G,)`` a power of two such that each sample of
    ``X`` ``(G, L, d)`` has ``max |X / s|`` in ``[1, 2)`` (``s = 1`` for a zero sample).
    Dividing by a power of two is exact (only entries below ``tiny * s`` lose digits),
    as in LAPACK's ``xLASCL`` scaling before an SVD."""
    peak = X.abs().amax(dim=(-2, -1))
    _, exponent = torch.frexp(peak)  # peak = m 2^e, 0.5 <= m < 1
    s = torch.where(peak > 0, torch.ldexp(torch.ones_like(peak), exponent - 1), torch.ones_like(peak))
    return X / s.reshape(-1, 1, 1), s


def svdvals_fast(X: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.svdvals`` of the tall orientation: same values, but LAPACK on CPU
    is several times slower for wide ``(N < d)`` matrices than for their transpose."""
    return torch.linalg.svdvals(X.mT if X.shape[-2] < X.shape[-1] else X)


# ---- input handling -----------------------------------------------------------
def data_eps(X) -> float:
    """Machine epsilon of the input's own floating dtype (0 for integer or other
    input, which is exact): the precision the data has, whatever the compute dtype."""
    dtype = getattr(X, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    if isinstance(dtype, np.dtype) and np.issubdtype(dtype, np.floating):
        return float(np.finfo(dtype).eps)
    return 0.0


def _numpy_to_torch(X: np.ndarray) -> torch.Tensor:
    """A numeric numpy array as a tensor. Non-native byte order (big-endian ``>f8``
    from a file written on another machine) is valid data: it is converted to native
    order (values unchanged). Strings, objects, dates and other non-numeric dtypes
    are refused: they have no metric."""
    if X.dtype.kind not in "biufc":
        raise MetricError(f"X must hold numbers (bool, integer or floating), got numpy dtype {X.dtype}")
    if not X.dtype.isnative:
        X = X.astype(X.dtype.newbyteorder("="))
    return torch.from_numpy(np.ascontiguousarray(X))


def as_batch(X, dtype) -> tuple[torch.Tensor, bool]:
    if isinstance(X, np.ndarray):
        X = _numpy_to_torch(X)
    if not isinstance(X, torch.Tensor):
        raise MetricError(f"X must be a torch.Tensor or numpy array, got {type(X).__name__}")
    check_tensor_storage(X, "X", error=MetricError)  # sparse or meta: no dense values to measure
    if X.ndim not in (2, 3):
        raise MetricError(f"X must have shape (N, d) or (B, N, d), got {X.ndim} dimension(s) {tuple(X.shape)}")
    if X.is_complex():
        raise MetricError("X must be real, got a complex tensor")
    if X.numel() == 0:
        raise MetricError(f"X is empty: shape {tuple(X.shape)}")
    if dtype is not None:
        if not dtype.is_floating_point:
            raise MetricError(f"dtype must be a floating type, got {dtype}")
        X = X.to(dtype)
    elif not X.dtype.is_floating_point:
        X = X.to(torch.get_default_dtype())
    elif X.dtype in (torch.float16, torch.bfloat16):
        X = X.float()  # linalg kernels need at least single precision
    batched = X.ndim == 3
    return (X if batched else X.unsqueeze(0)), batched


def _as_padding(padding_mask, shape, batched, device) -> torch.Tensor | None:
    if padding_mask is None:
        return None
    check_tensor_storage(padding_mask, "padding_mask", error=MetricError)
    pm = torch.as_tensor(np.asarray(padding_mask) if not isinstance(padding_mask, torch.Tensor) else padding_mask)
    want = tuple(shape) if batched else tuple(shape[1:])
    if tuple(pm.shape) != want:
        raise MetricError(f"padding_mask must have shape {want} (True = real token), got {tuple(pm.shape)}")
    if pm.dtype != torch.bool:
        if pm.is_floating_point() or not bool(((pm == 0) | (pm == 1)).all()):
            raise MetricError("padding_mask must be boolean (or integer 0/1), True = real token")
        pm = pm.bool()
    pm = pm.to(device).reshape(shape)
    empty = ~pm.any(dim=-1)
    if bool(empty.any()):
        where = f"samples {torch.nonzero(empty).flatten()[:10].tolist()}" if batched else "the input"
        raise MetricError(f"padding_mask removes every token of {where}")
    return None if bool(pm.all()) else pm


def _as_graph(mask, n: int, b: int, device) -> torch.Tensor | None:
    """The graph of a metric: any mask form, or a ``(b, n, n)`` batch; rows without
    in-edges are allowed (a graph is not a softmax)."""
    if mask is None:
        return None
    M = dense_mask(mask, n, n_samples=b, require_keys=False, error=MetricError)
    return (M if M.ndim == 3 else M.unsqueeze(0)).to(device)


def check_finite(X: torch.Tensor, pm: torch.Tensor | None, batched: bool) -> None:
    if bool(torch.isfinite(X.sum(dim=(-2, -1))).all()):
        return  # fast path: one reduction; a NaN/Inf anywhere makes its sample's sum non-finite
    bad_rows = ~torch.isfinite(X).all(dim=-1)
    if pm is not None:
        bad_rows &= pm
    bad = bad_rows.any(dim=-1)
    if bool(bad.any()):
        where = f"samples {torch.nonzero(bad).flatten()[:10].tolist()}" if batched else "X"
        raise MetricError(f"NaN or Inf in {where}")


def _groups(X, pm, graph):
    """Yield ``(samples, X_real (G, L, d), graph_real (G or 1, L, L) | None)``, one per
    distinct number ``L`` of real tokens; boolean indexing keeps the token order."""
    B, N, d = X.shape
    if pm is None:
        yield torch.arange(B, device=X.device), X, graph
        return
    lengths = pm.sum(dim=-1)
    for L in torch.unique(lengths).tolist():
        samples = torch.nonzero(lengths == L).flatten()
        keep = pm[samples]
        Xg = X[samples][keep].reshape(len(samples), L, d)
        Wg = None
        if graph is not None:
            pairs = keep.unsqueeze(-1) & keep.unsqueeze(-2)
            Wg = graph.expand(B, N, N)[samples][pairs].reshape(len(samples), L, L)
        yield samples, Xg, Wg


def _checked_value(name: str, value: object, n: int) -> torch.Tensor:
    """``value`` of metric ``name`` on a group of ``n`` samples: a real tensor ``(n,)``.

    Raises
    ------
    MetricError
        Any other type, dtype or shape (a registered function that returns one value for
        the whole batch, or a per-token array).
    """
    if not isinstance(value, torch.Tensor) or value.shape != (n,) or value.is_complex() or value.dtype == torch.bool:
        got = (f"a {value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor)
               else type(value).__name__)
        raise MetricError(f"metric {name!r} returned {got}; a metric function returns a real tensor of shape "
                          f"({n},), one value per sample of its context")
    return value


def evaluate(
    X,
    fns: Mapping[str, MetricFn],
    *,
    padding_mask=None,
    mask=None,
    dtype: torch.dtype | None = None,
    tolerance: RankTolerance = RankTolerance(),
    stacklevel: int = 3,
) -> dict[str, torch.Tensor]:
    """Run the metric functions ``fns`` on every sample; values ``(B,)`` or 0-d.
    ``stacklevel`` makes a :class:`ZeroRowWarning` point at the caller's line."""
    eps = data_eps(X)
    Xb, batched = as_batch(X, dtype)
    B, N, _ = Xb.shape
    pm = _as_padding(padding_mask, (B, N), batched, Xb.device)
    graph = _as_graph(mask, N, B, Xb.device)
    check_finite(Xb, pm, batched)
    out = {name: torch.empty(B, dtype=Xb.dtype, device=Xb.device) for name in fns}
    n_zero = 0
    for samples, Xg, Wg in _groups(Xb, pm, graph):
        ctx = MetricContext(Xg, samples, Wg, tolerance, batched, eps)
        for name, fn in fns.items():
            out[name][samples] = _checked_value(name, fn(ctx), len(samples)).to(Xb.dtype)
        n_zero += ctx.n_zero_rows
    if n_zero:
        message = f"{n_zero} zero token(s) have no direction; they are excluded from cosine metrics"
        warnings.warn(message, ZeroRowWarning, stacklevel=stacklevel)
    return out if batched else {name: v[0] for name, v in out.items()}
