"""Input checking, padding-aware grouping and the intermediates metrics share.

Every metric is a function ``fn(ctx) -> (G,)`` of a :class:`MetricContext` holding the
real tokens of ``G`` samples of one length ``L`` as ``(G, L, d)``: a padded batch is split
into one context per distinct length, so a padded sample gives exactly the numbers of its
unpadded rows (``min(N, d)``, centring and pair counts all see ``L``).
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
from ..masks.mask import as_bool_matrix

MetricFn = Callable[["MetricContext"], torch.Tensor]
PAIR_BUDGET = 64 * 2**20  # bytes of a (G, L, L) pair matrix above which pair sums avoid forming it


class ZeroRowWarning(UserWarning):
    """Some tokens are exactly zero and were left out of cosine-based averages."""


@dataclass(frozen=True)
class RankTolerance:
    """Numerical-rank threshold: ``atol`` if given, else ``rtol * sigma_1`` if given,
    else the larger of two error sources (docs/metrics.md):

    1. the SVD's error ``sigma_1 * max(N, d) * eps(compute dtype)`` (numpy's
       ``matrix_rank`` rule; Golub & Van Loan §8.6.3);
    2. with ``noise_floor``, the storage's rounding ``u ||X||_F``, ``u = eps(input dtype) / 2``:
       by Weyl's inequality a singular value above it is not rounding alone.
    """

    atol: float | None = None
    rtol: float | None = None
    noise_floor: bool = True

    def threshold(self, svals: torch.Tensor, n: int, d: int, frobenius: torch.Tensor, storage_eps: float = 0.0):
        """Relative threshold ``(G, 1)`` (``atol`` is the caller's, on the input's scale) for
        singular values ``svals`` ``(G, k)`` of the normalised tokens with ``||X||_F``
        ``frobenius`` ``(G,)``; ``storage_eps``: eps of the input's dtype."""
        if self.rtol is not None:
            return svals[..., :1] * self.rtol
        tol = svals[..., :1] * (max(n, d) * torch.finfo(svals.dtype).eps)
        if self.noise_floor and storage_eps > 0:
            tol = torch.maximum(tol, (0.5 * storage_eps) * frobenius.unsqueeze(-1).to(svals.dtype))
        return tol


class MetricContext:
    """Real tokens of the samples ``samples`` plus lazily cached intermediates shared by all
    metrics of a call. ``X`` ``(G, L, d)`` holds each sample divided by ``scale`` ``(G,)``, a power
    of two with ``max |X| in [1, 2)`` (exact, so nothing under/overflows; metrics that scale with
    X multiply by ``scale``); ``normalise=False`` keeps ``X`` (``scale = 1``), exact for
    :data:`~rankcollapse.metrics.registry.UNSCALED_METRICS`. ``out``: a buffer for the unit rows.
    """

    def __init__(self, X, samples, graph, tolerance, batched, data_eps=0.0, *, normalise: bool = True,
                 out: torch.Tensor | None = None):
        self.X, self.scale = pow2_normalise(X) if normalise else (X, X.new_ones(X.shape[0]))
        self.data_eps = data_eps  # eps of the input's own dtype (before any cast)
        self.samples, self.tolerance, self._graph, self._batched, self._out = samples, tolerance, graph, batched, out
        self._cache: dict[str, object] = {}
        self.n_zero_rows = 0

    @property
    def n_tokens(self) -> int:
        return self.X.shape[-2]

    @property
    def dim(self) -> int:
        return self.X.shape[-1]

    def cached(self, key: str, make: Callable[[], object]):
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
        """Singular values ``(G, min(L, d))``, descending."""
        return self.cached("svals", lambda: svdvals_fast(self.X))

    def nonzero_svals(self, what: str) -> torch.Tensor:
        """:attr:`svals`, refusing the zero matrix (``what`` is undefined there)."""
        S = self.svals
        self.fail(S[..., 0] == 0, f"X is the zero matrix: {what} is undefined")
        return S

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
        """``x_i / ||x_i||`` ``(G, L, d)``; zero tokens stay zero."""
        return self.cached("unit", lambda: torch.mul(self.X, self.inv_norms.unsqueeze(-1), out=self._out))

    @property
    def cos(self) -> torch.Tensor:
        """Pairwise cosines ``(G, L, L)``, diagonal and zero tokens' rows/columns 0."""

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
        """``sum_{i != j} cos(x_i, x_j)`` over non-zero tokens ``(G,)``; above
        :data:`PAIR_BUDGET` as ``||sum_i u_i||^2 - sum_i ||u_i||^2``, O(L d)."""
        if self._pairs_fit():
            return self.cos.sum(dim=(-2, -1))
        u = self.unit_rows
        return u.sum(dim=-2).square().sum(dim=-1) - u.square().sum(dim=(-2, -1))

    def abs_cos_pair_sum(self) -> torch.Tensor:
        """``sum_{i != j} |cos(x_i, x_j)|`` over non-zero tokens ``(G,)``; above
        :data:`PAIR_BUDGET` in row chunks of the upper triangle (memory ``O(PAIR_BUDGET)``)."""
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
        """Edge weights ``(G or 1, L, L)``; the complete graph without a mask."""
        return self.cached("graph", lambda: self.X.new_ones(1, self.n_tokens, self.n_tokens) if self._graph is None
                           else self._graph.to(self.X.dtype))


def stable_norm(Y: torch.Tensor, dim) -> torch.Tensor:
    """``torch.linalg.vector_norm(Y, dim=dim)`` without overflow or underflow of the squares.

    Where the plain norm is not safely inside the range, the slices are divided by a power
    of two near their largest entry (exact) and the norm scaled back, as LAPACK's ``xNRM2``
    (Blue 1978, "A portable Fortran program to find the Euclidean norm of a vector").
    """
    r = torch.linalg.vector_norm(Y, dim=dim)
    info = torch.finfo(Y.dtype)
    low = math.sqrt(info.tiny) / info.eps  # below this, lost squares could matter
    if Y.numel() == 0:
        return r
    lo, hi = r.detach().aminmax()  # NaN in both where r has a NaN
    if low <= float(lo) and float(hi) <= info.max:
        return r
    s = _pow2(Y.abs().amax(dim=dim, keepdim=True))
    return torch.linalg.vector_norm(Y / s, dim=dim) * s.reshape(r.shape)


def pow2_normalise(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X / s, s)``, ``s`` ``(G,)`` the power of two with ``max |X / s|`` in ``[1, 2)`` per
    sample of ``X`` ``(G, L, d)`` (1 for a zero sample), as LAPACK's ``xLASCL``."""
    s = _pow2(X.abs().amax(dim=(-2, -1)))
    return X / s.reshape(-1, 1, 1), s


def _pow2(peak: torch.Tensor) -> torch.Tensor:
    """``2^(e-1)`` for ``peak = m 2^e``, ``0.5 <= m < 1`` (``peak / 2^(e-1)`` in ``[1, 2)``); 1 at 0."""
    _, exponent = torch.frexp(peak)
    return torch.where(peak > 0, torch.ldexp(torch.ones_like(peak), exponent - 1), 1.0)


def svdvals_fast(X: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.svdvals`` of the tall orientation (LAPACK is slower on wide matrices)."""
    return torch.linalg.svdvals(X.mT if X.shape[-2] < X.shape[-1] else X)


# ---- input handling -----------------------------------------------------------
def data_eps(X) -> float:
    """Machine epsilon of the input's own floating dtype (0 for exact, non-float input)."""
    dtype = getattr(X, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    if isinstance(dtype, np.dtype) and np.issubdtype(dtype, np.floating):
        return float(np.finfo(dtype).eps)
    return 0.0


def _numpy_to_torch(X: np.ndarray) -> torch.Tensor:
    """A numeric numpy array (either byte order) as a tensor; non-numeric dtypes refused."""
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
    pm = as_bool_matrix(pm, MetricError, "padding_mask (True = real token)").to(device).reshape(shape)
    empty = ~pm.any(dim=-1)
    if bool(empty.any()):
        where = f"samples {torch.nonzero(empty).flatten()[:10].tolist()}" if batched else "the input"
        raise MetricError(f"padding_mask removes every token of {where}")
    return None if bool(pm.all()) else pm


def _as_graph(mask, n: int, b: int, device) -> torch.Tensor | None:
    """The graph of a metric, any mask form; rows without keys are allowed."""
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
    """Yield ``(samples, X_real (G, L, d), graph_real (G or 1, L, L) | None)`` per distinct
    number ``L`` of real tokens."""
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
    """``value`` of metric ``name`` on ``n`` samples, refused (:class:`MetricError`) unless
    a real tensor ``(n,)``."""
    if not isinstance(value, torch.Tensor) or value.shape != (n,) or value.is_complex() or value.dtype == torch.bool:
        got = (f"a {value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor)
               else type(value).__name__)
        raise MetricError(f"metric {name!r} returned {got}; a metric function returns a real tensor of shape "
                          f"({n},), one value per sample of its context")
    return value


def evaluate(X, fns: Mapping[str, MetricFn], *, padding_mask=None, mask=None, dtype: torch.dtype | None = None,
             tolerance: RankTolerance = RankTolerance(), stacklevel: int = 3) -> dict[str, torch.Tensor]:
    """Run the metric functions ``fns`` on every sample; values ``(B,)`` or 0-d.
    ``stacklevel``: of the :class:`ZeroRowWarning`."""
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
        warnings.warn(f"{n_zero} zero token(s) have no direction; they are excluded from cosine metrics",
                      ZeroRowWarning, stacklevel=stacklevel)
    return out if batched else {name: v[0] for name, v in out.items()}


def evaluate_one(X, name: str, fn: MetricFn, **kwargs) -> torch.Tensor:
    """:func:`evaluate` of one metric for a public function (its warning points at the caller's line)."""
    return evaluate(X, {name: fn}, stacklevel=4, **kwargs)[name]
