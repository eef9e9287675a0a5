"""Metrics by name: the registry reports, the simulator and the CLI refer to.

A metrics report (:func:`report_metrics`) where one undefined metric never hides the others: a
metric undefined on the input, not finite at its scale or over the memory limit is reported as
``None`` with a reason; only an input no metric can take raises.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable

import numpy as np
import torch

from .._display import NotebookResult
from .._memory import check_memory
from .._validate import check_float
from ..errors import MemoryLimitError, MetricError
from . import _context, core, power, spectral
from .attention import attention_entropy, participation_ratio, row_mass_deficit
from ._context import MetricFn, RankTolerance, evaluate


def _n_clusters(ctx) -> torch.Tensor:
    U = ctx.X * ctx.inv_norms.unsqueeze(-1)
    return core.components(U, ctx.row_valid, core.CLUSTER_ANGLE).to(ctx.X.device, ctx.X.dtype)


@dataclass(frozen=True)
class MetricSpec:
    """A named metric: ``fn(ctx) -> (G,)`` on a :class:`~rankcollapse.metrics.MetricContext`
    (:data:`METRICS`; the other registries state their signature), a one-line
    ``description`` with the formula, the value at full token collapse if defined, and
    whether the attention-mask graph changes the value."""

    name: str
    fn: MetricFn
    description: str
    collapse_value: float | None = None
    uses_mask: bool = False


_SPECS = (
    MetricSpec("mu", core._mu, "||X - 1 gamma_X||_F, distance to token uniformity", 0.0),
    MetricSpec("mu_relative", core._mu_relative, "mu(X) / ||X||_F", 0.0),
    MetricSpec("max_token_share", core._max_token_share, "max_i ||x_i||^2 / ||X||_F^2, share of the largest token"),
    MetricSpec("norm_spread", core._norm_spread, "max_i ||x_i|| / min_i ||x_i||, spread of the token norms", None),
    MetricSpec("rank_fraction", spectral._rank_fraction, "numerical rank / min(N, d)"),
    MetricSpec("numerical_rank", spectral._numerical_rank, "#{sigma_k > max(sigma_1 max(N, d) eps, u ||X||_F)}", 1.0),
    MetricSpec("sigma_min", spectral._sigma_min, "smallest singular value sigma_min(N, d)"),
    MetricSpec("sigma_ratio", spectral._sigma_ratio, "sigma_2 / sigma_1", 0.0),
    MetricSpec("rank_one_distance", spectral._rank_one_distance, "sqrt(sum_{k>=2} sigma_k^2)", 0.0),
    MetricSpec("stable_rank", spectral._stable_rank, "||X||_F^2 / sigma_1^2", 1.0),
    MetricSpec("effective_rank", spectral._effective_rank, "exp(entropy of sigma / sum sigma)", 1.0),
    MetricSpec("avg_abs_cos", core._avg_abs_cos, "mean_{i != j} |cos(x_i, x_j)|", 1.0),
    MetricSpec("avg_cos", core._avg_cos, "mean_{i != j} cos(x_i, x_j)", 1.0),
    MetricSpec("cos_to_mean", core._cos_to_mean, "mean_i cos(x_i, gamma_X)", 1.0),
    MetricSpec("dong_residual", core._dong_residual, "sqrt(||R||_1 ||R||_inf), R = X - 1 gamma_X", 0.0),
    MetricSpec("dong_residual_relative", core._dong_residual_relative, "dong_residual / ||X||_{1,inf}", 0.0),
    MetricSpec("dirichlet_energy", core._dirichlet_energy, "(1/N) sum_{M[i,j]} ||x_i - x_j||^2", 0.0, True),
    MetricSpec("mean_average_distance", core._mean_average_distance, "mean_i mean_{j: M[i,j]} (1 - cos)", 0.0, True),
    MetricSpec("n_clusters", _n_clusters, "connected components of the graph linking tokens at angle < 0.1 rad "
               "(CLUSTER_ANGLE; zero tokens left out)", 1.0),
    MetricSpec("isoscore", spectral._isoscore, "IsoScore (Rudman et al. 2022), 1 = isotropic", 0.0),
    MetricSpec("max_norm_ratio", spectral._max_norm_ratio, "max_i ||x_i|| / median_i ||x_i||, massive-token ratio", 1.0),
    MetricSpec("max_norm_position", spectral._max_norm_position, "argmax_i ||x_i|| among real tokens (0 = first)"),
    MetricSpec("top_singular_share", spectral._top_singular_share, "sigma_1^2 / ||X||_F^2", 1.0),
    MetricSpec("max_token_sigma_share", spectral._max_token_sigma_share,
               "max_i ||x_i||^2 / sigma_1^2 (<= 1), share of sigma_1^2 the largest token explains"),
    MetricSpec("matrix_entropy", spectral._matrix_entropy, "-sum p_i ln p_i, p_i = sigma_i^2 / sum sigma^2 (nats)", 0.0),
    MetricSpec("alpha_req", spectral._alpha_req,
               "alpha-ReQ (Agrawal et al. 2022): -slope of OLS ln sigma_i^2 on ln i, i = 1..numerical rank"),
    MetricSpec("token_radius", spectral._token_radius, "(1/N) sum_i ||x_i||, mean token norm"),
    MetricSpec("interaction_energy", core.energy_of,
               "(1/2 beta) sum_{i,j} exp(beta cos(x_i, x_j)), beta = 1 (zero tokens left out)"),
)

METRICS: dict[str, MetricSpec] = {spec.name: spec for spec in _SPECS}
"""All metrics of token matrices X by name, in report order."""

ATTENTION_METRICS: dict[str, MetricSpec] = {spec.name: spec for spec in (
    MetricSpec("attention_entropy", attention_entropy, "mean over heads and rows with >= 2 allowed keys of "
               "-sum_j A_ij log A_ij / log(#allowed keys); 1 = uniform, 0 = one-hot", None, True),
    MetricSpec("row_mass_deficit", row_mass_deficit,
               "mean over heads and real queries of 1 - sum_j A_ij; 0 for softmax rows, > 0 with a sink", None, False),
    *(MetricSpec(name, partial(participation_ratio, summary=summary), f"{summary} over heads and real queries of "
                 "1 / sum_j A_ij^2, the effective number of keys attended; k = uniform over k keys, 1 = one-hot",
                 None, True)
      for name, summary in (("participation_ratio", "mean"), ("participation_ratio_median", "median"),
                            ("participation_ratio_max", "max"))))}
"""Metrics of attention probabilities ``A`` ``(B, H, N, N)``: ``fn(A, mask, padding_mask=)``;
:func:`compute_metrics` takes them with ``attention=A``."""

#: Metrics of the :func:`~rankcollapse.metrics._context.stable_norm` row norms, μ, the mean
#: token and the unit rows alone: exact on unscaled tokens (``MetricContext(normalise=False)``).
UNSCALED_METRICS = frozenset({"mu", "mu_relative", "max_token_share", "norm_spread", "token_radius",
                              "avg_cos", "avg_abs_cos", "cos_to_mean"})

STEP_METRICS: dict[str, MetricSpec] = {"angular_speed": MetricSpec(
    "angular_speed", spectral.angular_speed,
    "(1/N) sum_i angle(x_i(t), x_i(t+1)) in radians, mean turn of a token in one layer")}
"""Metrics of two consecutive states: ``fn(X_prev, X_next) -> (B,)``, computed by
:func:`~rankcollapse.dynamics.simulate` (row 0 NaN), refused by :func:`compute_metrics`."""

WEIGHT_METRICS: dict[str, MetricSpec] = {"v1_alignment": MetricSpec(
    "v1_alignment", power.layer_v1_alignment,
    "(1/N) sum_i |<x_i/||x_i||, v_1>|, v_1 the principal eigenvector of the layer's W_O W_V "
    "(row convention: of (W_V W_O)^T)")}
"""Metrics of X and the weights of the layer acting on it: ``fn(X, layer) -> (B,)``,
computed by :func:`~rankcollapse.dynamics.simulate` (row ``t`` with layer ``max(t, 1)``),
refused by :func:`compute_metrics`."""

#: A metric name: it becomes a table column, a CLI list item and a keyword.
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def register_metric(name: str, fn: Callable[..., torch.Tensor], description: str, *,
                    collapse_value: float | None = None, uses_mask: bool = False) -> MetricSpec:
    """Add a metric of token matrices to :data:`METRICS` (in this process), so that
    :func:`compute_metrics`, ``report_metrics`` and ``simulate(metrics=...)`` take it by name.

    Parameters
    ----------
    name : lower-case identifier (``[a-z][a-z0-9_]*``) not yet registered.
    fn : ``fn(ctx) -> (G,)`` on a :class:`~rankcollapse.metrics.MetricContext`: ``ctx.X``
        ``(G, L, d)`` holds the real tokens divided by ``ctx.scale`` ``(G,)`` (a value that
        scales with X multiplies by it); shared intermediates ``ctx.svals``, ``ctx.cos``,
        ``ctx.graph`` ...; ``ctx.fail(bad, "why")`` where the value is undefined.
    description, collapse_value, uses_mask : as :class:`MetricSpec`.

    Returns
    -------
    MetricSpec : the registered entry.

    Raises
    ------
    MetricError
        A name taken or not such an identifier; ``fn`` not callable with one argument; a
        ``description`` not one line; ``collapse_value`` not finite or None; ``uses_mask``
        not a bool.

    See Also
    --------
    compute_metrics : computes registered metrics by name.
    MetricSpec : the registry's entry.

    Examples
    --------
    >>> import torch
    >>> from rankcollapse.metrics import METRICS, compute_metrics, register_metric
    >>> def sigma_1(ctx):  # the largest singular value; it scales with X
    ...     return ctx.svals[..., 0] * ctx.scale
    >>> spec = register_metric("sigma_1_example", sigma_1, "largest singular value sigma_1")
    >>> X = torch.tensor([[3.0, 0.0], [0.0, 4.0]], dtype=torch.float64)
    >>> float(compute_metrics(X, ["sigma_1_example"])["sigma_1_example"])
    4.0
    >>> register_metric("sigma_1_example", sigma_1, "again")
    Traceback (most recent call last):
    ...
    rankcollapse.errors.MetricError: metric 'sigma_1_example' is already registered (fn=sigma_1); choose another name
    >>> del METRICS["sigma_1_example"]  # (this example leaves the registry as it found it)
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise MetricError(f"metric name must be a lower-case identifier ([a-z][a-z0-9_]*), got {name!r}")
    taken = METRICS.get(name) or ATTENTION_METRICS.get(name) or STEP_METRICS.get(name) or WEIGHT_METRICS.get(name)
    if taken is not None:
        raise MetricError(f"metric {name!r} is already registered (fn={getattr(taken.fn, '__name__', taken.fn)}); "
                          "choose another name")
    if not callable(fn):
        raise MetricError(f"metric {name!r}: fn must be callable as fn(ctx), got {type(fn).__name__}")
    try:
        inspect.signature(fn).bind(object())
    except TypeError as exc:
        raise MetricError(f"metric {name!r}: fn must take the MetricContext as its only argument ({exc})") from None
    except ValueError:  # a builtin without a signature: its call is checked when the metric runs
        pass
    if not isinstance(description, str) or not description.strip() or "\n" in description.strip():
        raise MetricError(f"metric {name!r}: description must be one non-empty line, got {description!r}")
    if collapse_value is not None and (isinstance(collapse_value, bool) or not isinstance(collapse_value, (int, float))
                                       or not math.isfinite(collapse_value)):
        raise MetricError(f"metric {name!r}: collapse_value must be a finite number or None, got {collapse_value!r}")
    if not isinstance(uses_mask, bool):
        raise MetricError(f"metric {name!r}: uses_mask must be True or False, got {uses_mask!r}")
    spec = MetricSpec(name, fn, description.strip(), None if collapse_value is None else float(collapse_value),
                      uses_mask)
    METRICS[name] = spec
    return spec


#: Pairwise metrics that always form the ``(B, N, N)`` matrices.
DENSE_PAIRWISE = frozenset({"dirichlet_energy", "mean_average_distance", "interaction_energy", "n_clusters"})
#: ``(B, N, N)`` arrays alive at once in the dense pairwise formulas (Gram, cosines, graph).
PAIRWISE_COPIES = 3
#: ``(B, N, d)`` arrays alive at once in any call (cast, normalised, centred, unit, scratch).
TOKEN_COPIES = 5


def metrics_bytes(shape: tuple[int, ...], names, itemsize: int) -> tuple[int, bool]:
    """``(bytes, dense)``: the memory ``names`` need on X of ``shape`` along the path the
    metrics take, and whether it forms ``(B, N, N)`` matrices (:data:`DENSE_PAIRWISE`; the
    cosine averages only below :data:`~rankcollapse.metrics._context.PAIR_BUDGET`)."""
    b = shape[0] if len(shape) == 3 else 1
    n, d = shape[-2], shape[-1]
    tokens = TOKEN_COPIES * b * n * d * itemsize
    names = set(names)
    pairs = b * n * n * itemsize
    if names & DENSE_PAIRWISE:
        return tokens + PAIRWISE_COPIES * pairs, True
    if names & {"avg_cos", "avg_abs_cos"}:  # two pair matrices up to PAIR_BUDGET, else row chunks of that size
        return tokens + (2 * pairs if pairs <= _context.PAIR_BUDGET else _context.PAIR_BUDGET), False
    return tokens, False


def check_pairwise_memory(X, names, dtype, max_memory) -> None:
    """Refuse (:class:`MemoryLimitError`) metrics whose :func:`metrics_bytes` on ``X`` exceed
    ``max_memory`` (default half the RAM)."""
    shape = tuple(getattr(X, "shape", ()))
    if len(shape) in (2, 3):
        single = (torch.float32, torch.float16, torch.bfloat16)
        itemsize = 4 if dtype == torch.float32 or (dtype is None and getattr(X, "dtype", None) in single) else 8
        estimate, dense = metrics_bytes(shape, names, itemsize)
        what = (f"computing (N, N) pairwise matrices ({', '.join(sorted(DENSE_PAIRWISE.intersection(names)))}) "
                f"at N = {shape[-2]}" if dense else f"computing metrics at N = {shape[-2]}")
        check_memory(estimate, what, max_memory)


DEFAULT_METRICS: tuple[str, ...] = ("mu", "mu_relative", "rank_fraction", "sigma_min", "avg_abs_cos", "sigma_ratio",
                                    "rank_one_distance", "stable_rank", "effective_rank")
"""The first-cut metrics plus the spectral ones of the same SVD."""


def compute_metrics(X, names: Iterable[str] | None = None, *, padding_mask=None, mask=None,
                    dtype: torch.dtype | None = None, rank_atol: float | None = None, rank_rtol: float | None = None,
                    rank_noise_floor: bool = True, max_memory: int | str | None = None,
                    attention=None) -> dict[str, torch.Tensor]:
    """Compute several metrics at once, sharing one SVD and one Gram matrix per length.

    Parameters
    ----------
    X : tensor or array ``(N, d)`` or ``(B, N, d)``, real (bool, integer or floating).
    names : keys of :data:`METRICS` (and of :data:`ATTENTION_METRICS` with ``attention``);
        default :data:`DEFAULT_METRICS`; ``"all"`` for every one.
    padding_mask : bool ``(N,)`` or ``(B, N)`` (integer 0/1 accepted), True = real token:
        each sample's metrics are exactly those of its real rows.
    mask : any mask form over the padded positions, the graph of ``dirichlet_energy`` and
        ``mean_average_distance`` (default complete).
    dtype : compute dtype (or its name, ``"float64"``); default X's (half precision: float32).
    rank_atol, rank_rtol, rank_noise_floor : :func:`rankcollapse.metrics.numerical_rank`'s tolerance.
    attention : the attention probabilities ``(N, N)``, ``(B, N, N)`` or ``(B, H, N, N)`` of
        the layer that produced X, for :data:`ATTENTION_METRICS`.
    max_memory : bytes (or ``"8GiB"``) the metrics may allocate (:func:`metrics_bytes`),
        checked before any allocation; default half the physical memory.

    Returns
    -------
    dict[str, torch.Tensor] : ``name -> value`` in the order of ``names``, 0-d or ``(B,)``.

    Raises
    ------
    MetricError
        An unknown name; X not 2-D/3-D, empty, non-finite on a real token, sparse, on the
        meta device or non-numeric; a bad padding mask; a metric undefined on the input
        (``report_metrics`` reports it instead); a bad ``dtype`` or rank tolerance.
    MemoryLimitError
        :func:`metrics_bytes` above ``max_memory``.

    See Also
    --------
    report_metrics : the same metrics, undefined ones reported as None with a reason.
    register_metric : add a metric by name.
    rankcollapse.dynamics.simulate : computes these metrics after every layer.

    Examples
    --------
    >>> import torch
    >>> X = torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], dtype=torch.float64)
    >>> out = compute_metrics(X, ["mu", "rank_fraction"])  # three equal tokens: collapsed
    >>> float(out["mu"]), float(out["rank_fraction"])
    (0.0, 0.5)
    >>> I = torch.eye(3, dtype=torch.float64)  # mu(I) = ||I - 11^T/3||_F = sqrt(2)
    >>> round(float(compute_metrics(I, ["mu"])["mu"]) ** 2, 12)
    2.0
    """
    if names is None:
        names = DEFAULT_METRICS
    elif isinstance(names, str):
        names = (*METRICS, *(ATTENTION_METRICS if attention is not None else ())) if names == "all" else (names,)
    names = tuple(dict.fromkeys(names))
    unknown = [n for n in names if n not in METRICS and n not in ATTENTION_METRICS]
    for table, what in ((STEP_METRICS, "two consecutive states X(t), X(t+1), not of one X: call "
                                       "rankcollapse.metrics.STEP_METRICS[name].fn(X_prev, X_next)"),
                        (WEIGHT_METRICS, "X and a layer's weights: call "
                                         "rankcollapse.metrics.WEIGHT_METRICS[name].fn(X, layer)")):
        other = [n for n in unknown if n in table]
        if other:
            raise MetricError(f"{other} are metrics of {what}, or simulate(metrics=...)")
    if unknown:
        raise MetricError(f"unknown metric(s) {unknown}; available: {', '.join((*METRICS, *ATTENTION_METRICS))}")
    if not names:
        raise MetricError("no metric names given")
    of_attention = [n for n in names if n in ATTENTION_METRICS]
    if of_attention and attention is None:
        raise MetricError(f"{', '.join(of_attention)}: a metric of attention probabilities, not of tokens; "
                          "give attention=A, the layer's softmax output (B, H, N, N)")
    fns = {n: METRICS[n].fn for n in names if n in METRICS}
    rank_atol, rank_rtol = (None if t is None else check_float(t, name, low=0.0, error=MetricError)
                            for t, name in ((rank_atol, "rank_atol"), (rank_rtol, "rank_rtol")))
    tolerance = RankTolerance(rank_atol, rank_rtol, rank_noise_floor)
    dtype = _as_dtype(dtype)
    check_pairwise_memory(X, fns, dtype, max_memory)
    out = evaluate(X, fns, padding_mask=padding_mask, mask=mask, dtype=dtype, tolerance=tolerance) if fns else {}
    for n in of_attention:
        value = ATTENTION_METRICS[n].fn(attention, mask, padding_mask=padding_mask)
        out[n] = value.to(dtype or (next(iter(out.values())).dtype if out else value.dtype))
    return {n: out[n] for n in names}


def _as_dtype(dtype) -> torch.dtype | None:
    """``dtype`` as a torch dtype; names such as ``"float64"`` accepted."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    named = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(named, torch.dtype):
        raise MetricError(f"dtype must be a torch floating dtype such as torch.float64 or 'float64', got {dtype!r}")
    return named


@dataclass
class MetricReport(NotebookResult):
    """Values of the metrics that are defined, and why the others are not.

    Attributes
    ----------
    values : ``name -> tensor`` (0-d or ``(B,)``), every requested metric in order; NaN where
        undefined.
    undefined : ``name -> reason``; a metric undefined on some samples is undefined for all.
    batched : True for a ``(B, N, d)`` input.
    """

    values: dict[str, torch.Tensor]
    undefined: dict[str, str] = field(default_factory=dict)
    batched: bool = False

    def rows(self) -> dict | list[dict]:
        """JSON-ready rows (undefined values ``None``, with ``"undefined": {name: reason}``):
        one dict for ``(N, d)``, one per sample for a batch."""
        table = {name: v.double().reshape(-1).tolist() for name, v in self.values.items()}
        n_rows = len(next(iter(table.values())))
        out = []
        for i in range(n_rows):
            row = {name: (col[i] if math.isfinite(col[i]) else None) for name, col in table.items()}
            missing = {name: self.undefined[name] for name, v in row.items() if v is None and name in self.undefined}
            if missing:
                row["undefined"] = missing
            out.append(row)
        return out if self.batched else out[0]

    def to_pandas(self) -> Any:
        """Tidy :class:`pandas.DataFrame` ``sample, metric, value, undefined`` (float64; NaN
        and the reason where undefined, else ``""``), one row per sample and metric."""
        import pandas as pd

        names = list(self.values)
        cols = [self.values[n].detach().double().cpu().reshape(-1).numpy() for n in names]
        B = len(cols[0]) if cols else 0
        return pd.DataFrame({
            "sample": np.tile(np.arange(B), len(names)),
            "metric": np.repeat(np.array(names, dtype=object), B),
            "value": np.concatenate(cols) if cols else np.zeros(0),
            "undefined": np.repeat(np.array([self.undefined.get(n, "") for n in names], dtype=object), B),
        })

    def to_dict(self) -> dict[str, Any]:
        """Summary for a notebook: metrics, sample count, and the undefined ones."""
        n = len(next(iter(self.values.values())).reshape(-1)) if self.values else 0
        return {"metrics": list(self.values), "batched": self.batched, "n_samples": n,
                "undefined": list(self.undefined)}


def report_metrics(
    X, names: Iterable[str] | None = None, *, padding_mask=None, mask=None, dtype=None,
    rank_atol: float | None = None, rank_rtol: float | None = None, max_memory: int | str | None = None,
) -> MetricReport:
    """Metrics of ``X`` with undefined ones reported, not raised (module docstring).

    Parameters as :func:`~rankcollapse.metrics.compute_metrics`; a metric above ``max_memory``
    is undefined with the estimate in the reason. :class:`MetricError` for unknown names, or
    an input no requested metric can take (the first error).
    """
    names = DEFAULT_METRICS if names is None else ((names,) if isinstance(names, str) else tuple(names))
    names = tuple(METRICS) if names == ("all",) else tuple(dict.fromkeys(names))
    unknown = [n for n in names if n not in METRICS]
    if unknown or not names:
        compute_metrics(X, names)  # raises the registry's message
    kw = dict(padding_mask=padding_mask, mask=mask, dtype=dtype, rank_atol=rank_atol, rank_rtol=rank_rtol,
              max_memory=max_memory)
    undefined = {}
    for name in names:  # which metrics are too large on their own; the others still run
        try:
            check_pairwise_memory(X, (name,), _as_dtype(dtype), max_memory)
        except MemoryLimitError as exc:
            undefined[name] = f"the memory limit {exc.detail}"  # read by API and CLI users alike
    todo = [n for n in names if n not in undefined]
    values = _compute(X, todo, undefined, kw) if todo else {}
    if not values:
        raise MetricError("; ".join(f"{n}: {r}" for n, r in undefined.items()))
    template = next(iter(values.values()))
    for name, v in values.items():
        if name not in undefined and not bool(torch.isfinite(v).all()):
            undefined[name] = (f"not finite in {v.dtype} at this input's scale (the formula's squares or sums "
                               "leave the floating-point range)")
    values = {n: values.get(n, torch.full_like(template, math.nan)) for n in names}
    return MetricReport(values, {n: undefined[n] for n in names if n in undefined}, batched=template.ndim == 1)


def _compute(X, todo, undefined, kw) -> dict[str, torch.Tensor]:
    try:
        return compute_metrics(X, todo, **kw)
    except MetricError:
        pass  # find which metrics fail; the others are still reported
    values, first = {}, None
    for name in todo:
        try:
            values[name] = compute_metrics(X, [name], **kw)[name]
        except MetricError as exc:
            undefined[name] = str(exc)
            first = first or exc
    if not values and first is not None:
        raise first
    return values
