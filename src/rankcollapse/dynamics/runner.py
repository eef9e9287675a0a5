"""``simulate``: run the self-attention dynamics of spec.md §2 and stream metrics (docs/dynamics.md)."""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from .._display import NotebookResult
from .._figure import new_axes
from .._io import strict_json
from .._progress import Steps, steps
from .._validate import check_device, check_float, check_tensor_storage
from ..errors import ConfigError, MetricError
from .._memory import check_memory, check_simulate_tokens
from ..masks import Mask, resolve_mask
from ..masks.schedule import is_schedule, parse_schedule
from ..metrics import METRICS, STEP_METRICS, compute_metrics
from ..metrics.registry import UNSCALED_METRICS, WEIGHT_METRICS
from ..metrics._context import MetricContext, RankTolerance
from ..metrics.core import dominant_token_text, mu_finite
from ..metrics.floor import epsilon as dtype_epsilon, mark_floor
from ..points import point_after
from .attention import kept
from .config import BlockConfig, RunConfig, resolve_variant, variant_name
from .operators import parse_attention
from .layers import Attention, FlexBackend, ScheduledAttention, apply_norm, block_forward, warn_zero_rows
from .chunks import chunk_threads
from .sparse import DEFAULT_BLOCK_SIZE, SCORE_BUDGET, BlockPlan
from .weights import LayerWeights, MatrixSource, random_layers

DEFAULT_SIM_METRICS = ("mu", "mu_relative")
#: Metrics of the tokens' norms that tell apart states μ/‖X‖_F reads alike (:meth:`SimResult.report`).
STATE_METRICS = ("token_radius", "max_token_share")
_FLOAT32_METRIC_LIMIT = 1e12  # above this |x|, metrics of float32 X are computed in float64
_DENSE_SCORE_BUDGET = 64 * 2**20  # bytes of (B, H, N, N) scores above which sparse masks go blocked


@dataclass
class SimResult(NotebookResult):
    """Output of :func:`simulate`.

    metrics : name -> ``(depth+1, B)`` float64 CPU tensor; row ``t`` is after ``t`` layers.
    final_metrics : name -> ``(B,)`` after the final norm, or None without ``final_norm``.
    epsilon_measured : ``(depth,)`` smallest allowed attention entry of each layer, or None.
    states : ``depth+1`` tensors ``(B, N, d)`` (CPU), or None.
    attention : ``depth`` tensors ``(B, H, N, N)`` (CPU), or None.
    config : JSON-able settings of the run.
    row_mass_deficit : ``(depth, B, H, 3)`` float64, the 5/50/95 % quantiles over queries of
        ``1 - sum_j A_ij`` for operators that are not row-stochastic; None for softmax and uniform.
    stopped : :class:`ZeroStop` when X underflowed to the zero matrix in some samples: the
        rows from that layer on are NaN, ``states`` ends there, ``final_metrics`` is None.
    """

    metrics: dict[str, torch.Tensor]
    config: dict
    epsilon_measured: torch.Tensor | None = None
    states: list[torch.Tensor] | None = None
    attention: list[torch.Tensor] | None = None
    final_metrics: dict[str, torch.Tensor] | None = None
    zero_rows: list[int] = field(default_factory=list)
    row_mass_deficit: torch.Tensor | None = None
    stopped: ZeroStop | None = None

    def to_pandas(self, *, summary: bool = False) -> Any:
        """Tidy frame ``layer, sample, metric, value`` (final-norm values at ``layer =
        "final_norm"``); with ``summary``, :meth:`summarise` instead."""
        import pandas as pd

        if summary:
            return self.summarise()

        frames = []
        for name, values in self.metrics.items():
            T, B = values.shape
            frames.append(pd.DataFrame({"layer": np.repeat(np.arange(T), B).astype(object),
                                        "sample": np.tile(np.arange(B), T), "metric": name,
                                        "value": values.flatten().numpy()}))
        for name, values in (self.final_metrics or {}).items():
            frames.append(pd.DataFrame({"layer": "final_norm", "sample": np.arange(values.shape[0]),
                                        "metric": name, "value": values.numpy()}))
        return pd.concat(frames, ignore_index=True)

    def summarise(self, *, per_window: bool = False) -> Any:
        """Statistics over samples in the layout of :mod:`rankcollapse.summary`, one row per
        layer and metric (final-norm values at ``layer = depth``, point ``final_norm``);
        ``per_window`` adds the per-sample ``values``."""
        from ..summary import by_layer, summary_table

        values = by_layer(self.metrics)
        depth = next((v.shape[0] - 1 for v in self.metrics.values()), 0)
        for name, v in (self.final_metrics or {}).items():
            values[(depth, "final_norm", name)] = v
        return summary_table(values, per_window=per_window)

    def to_dict(self) -> dict:
        """Settings and the last layer's mean of every metric (JSON-ready)."""
        last = {f"final_mean_{k}": float(v[-1].mean()) for k, v in self.metrics.items()}
        scalars = {k: v for k, v in self.config.items() if isinstance(v, (bool, int, float, str))}
        stopped = None if self.stopped is None else self.stopped.to_dict()
        return {**scalars, **last, "zero_rows": list(self.zero_rows), "stopped": stopped}

    def report(self, metrics: Sequence[str] | None = None, *, float64: str = "dtype=torch.float64") -> dict:
        """The run per layer as ``rankcollapse simulate`` reports it (JSON-ready): ``metrics``
        shown (default all, plus :data:`STATE_METRICS` when a note calls for them),
        ``layers`` (per layer the means over samples, ``epsilon_measured``,
        ``row_mass_deficit_q05/q50/q95``, ``at_floor``), ``floor``, ``stopped`` and
        ``notes`` (``float64``: how the caller asks for float64)."""
        depth, dtype, eps = self.config["depth"], self.config["dtype"], self.epsilon_measured
        layers = [{"layer": t, "point": point_after(t),
                   **{k: strict_json(float(v[t].mean())) for k, v in self.metrics.items()},
                   "epsilon_measured": None if t == 0 or eps is None else strict_json(float(eps[t - 1]))}
                  for t in range(depth + 1)]
        if self.row_mass_deficit is not None:  # (depth, B, H, 3): mean over samples and heads
            for t, q in enumerate(self.row_mass_deficit.mean(dim=(1, 2)).tolist(), start=1):
                layers[t].update(zip(("row_mass_deficit_q05", "row_mass_deficit_q50", "row_mass_deficit_q95"),
                                     strict_json(q)))
        notes = _state_notes(layers, self.config["block"]["attention"], dtype)
        asked = list(self.metrics) if metrics is None else list(metrics)
        shown = asked + [m for m in STATE_METRICS if m in self.metrics and m not in asked and notes]
        layers = [{k: v for k, v in row.items() if k in shown or k not in STATE_METRICS} for row in layers]
        if self.stopped is not None:
            notes.append(self.stopped.message(depth, float64=float64))
        floor = mark_floor(layers, shown, dtype, self.config["n_tokens"], self.config["d_model"])
        stopped = None if self.stopped is None else self.stopped.to_dict()
        return {"metrics": shown, "layers": layers, "floor": floor, "stopped": stopped, "notes": notes}

    def plot(self, metrics: list[str] | None = None, *, ax: Any = None, title: str | None = None) -> Any:
        """Mean over samples of ``metrics`` (default μ, μ/‖X‖_F) against layer, log-log,
        layer 0 dotted; returns the figure."""
        fig, ax = new_axes(ax, figsize=(6, 4))
        names = metrics or [k for k in ("mu", "mu_relative") if k in self.metrics] or list(self.metrics)
        for name in names:
            y = self.metrics[name].mean(1).numpy()
            ax.plot(range(1, len(y)), y[1:], marker=".", label=f"{name} (mean over samples)")
            ax.axhline(y[0], ls=":", lw=0.8, color=ax.lines[-1].get_color())
        ax.set(xscale="log", yscale="log", xlabel="layer t", ylabel="value (dotted: t = 0)", title=title or "")
        ax.legend()
        fig.tight_layout()
        return fig


def _state_notes(layers: list[dict], attention: str, dtype: str) -> list[str]:
    """Notes on what μ/‖X‖_F does not show in ``layers`` (:meth:`SimResult.report`)."""
    notes = []
    if not parse_attention(attention).row_stochastic:
        notes.append(f"attention {attention} is not row-stochastic (rows sum to 1 - row_mass_deficit): "
                     "μ/‖X‖_F is scale-free: it shows neither how the tokens' norms change (they may decay to 0) "
                     "nor one token taking over; read token_radius (mean token norm), max_token_share and row_mass_deficit beside it")
    dominant = dominant_token_text({row["layer"]: math.nan if row.get("max_token_share") is None
                                    else row["max_token_share"] for row in layers})
    if dominant is not None:
        notes.append(dominant)
    radius = [(row["layer"], row["token_radius"]) for row in layers if row.get("token_radius") is not None]
    if radius and radius[0][1] > 0:
        (_, r0), (t, r) = radius[0], radius[-1]
        if r <= dtype_epsilon(dtype) * r0:
            notes.append(f"the tokens decay towards 0: mean token norm {r0:.3g} at the input, {r:.3g} at layer {t} "
                         f"(below {dtype}'s machine epsilon times the input's: at the input's scale X is zero; "
                         f"{dtype} underflows below {float(np.finfo(np.dtype(dtype)).tiny):.3g})")
    return notes


def _as_tokens(X0, dtype, device) -> torch.Tensor:
    check_tensor_storage(X0, "X0")  # sparse or meta: no token values to evolve
    if not isinstance(X0, torch.Tensor):
        try:
            arr = np.asarray(X0)
        except ValueError as exc:  # a ragged nesting of lists
            raise ConfigError(f"X0 must be an (N, d) or (B, N, d) array: {str(exc).splitlines()[0][:120]}") from None
        if arr.dtype.kind not in "biuf":  # strings, objects, complex: torch cannot hold them as tokens
            raise ConfigError(f"X0 must be a floating-point array, got numpy dtype {arr.dtype}")
        X0 = torch.as_tensor(arr)
    X = X0.unsqueeze(0) if X0.ndim == 2 else X0
    if X.ndim != 3 or min(X.shape) < 1:
        raise ConfigError(f"X0 must have shape (N, d) or (B, N, d), got {tuple(X.shape)}")
    if not X.is_floating_point():
        raise ConfigError(f"X0 must be a floating-point array, got {X.dtype}")
    if dtype is None:
        dtype = X.dtype if X.dtype in (torch.float32, torch.float64) else torch.float32
    if dtype not in (torch.float32, torch.float64):
        raise ConfigError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    X = X.detach().to(device=device if device is not None else X.device, dtype=dtype)
    if not bool(torch.isfinite(X).all()):
        raise ConfigError("X0 contains NaN or Inf")
    return X


def _peak(X: torch.Tensor) -> float:
    """``max |X|`` with one reduction and one host sync; NaN or Inf if X has any."""
    lo, hi = X.aminmax()
    return float(torch.maximum(-lo, hi))


def _metric_fn(metrics, scratch: dict | None = None) -> tuple[tuple[str, ...], Callable, bool]:
    """Names, ``measure(X, mask, peak, prev=None, layer=None) -> {name: (B,)}`` and whether a
    metric needs the mask. ``prev``: X one layer earlier (step metrics, NaN at the input);
    ``layer``: the weights weight metrics read; ``scratch``: the attention's kept arrays."""
    if isinstance(metrics, Mapping):
        fns = dict(metrics)
        return tuple(fns), lambda X, mask, peak, prev=None, layer=None: {k: f(X) for k, f in fns.items()}, False
    names = tuple(DEFAULT_SIM_METRICS if metrics is None else ([metrics] if isinstance(metrics, str) else metrics))
    if "attention_entropy" in names:  # a metric of A(t), not of X(t)
        raise ConfigError("attention_entropy is a metric of attention probabilities, not of tokens: simulate with "
                          "run=RunConfig(record_attention=True) and apply rankcollapse.metrics.attention_entropy to each "
                          "result.attention[t] (phase reports it per cell)")
    unknown = [n for n in names if n not in METRICS and n not in STEP_METRICS and n not in WEIGHT_METRICS]
    if unknown:
        raise ConfigError(f"unknown metrics {unknown}; choose from {sorted([*METRICS, *STEP_METRICS, *WEIGHT_METRICS])}")
    uses_mask = any(METRICS[n].uses_mask for n in names if n in METRICS)
    step = tuple(n for n in names if n in STEP_METRICS)  # of (X(t-1), X(t)): computed from prev
    weighted = tuple(n for n in names if n in WEIGHT_METRICS)  # of X(t) and the weights of layer max(t, 1)
    state = tuple(n for n in names if n not in STEP_METRICS and n not in WEIGHT_METRICS)

    # metrics of the row norms, μ and the unit rows read X itself; the others a normalised copy of it
    unscaled = tuple(n for n in state if n in UNSCALED_METRICS)
    rest = tuple(n for n in state if n not in UNSCALED_METRICS)
    uses_mu = any(n in ("mu", "mu_relative") for n in unscaled)
    scratch = {} if scratch is None else scratch  # X - mean, reused by every layer (attention.kept)

    def measure_state(X, mask, peak):
        # float32 tokens past ~1e12 overflow Gram matrices (cosines) though X is finite
        wide = X.dtype == torch.float32 and not peak < _FLOAT32_METRIC_LIMIT
        if wide or not unscaled or X.dtype not in (torch.float32, torch.float64) or not math.isfinite(peak):
            return compute_metrics(X, state, mask=mask, dtype=torch.float64 if wide else None) if state else {}
        out = compute_metrics(X, rest, mask=mask) if rest else {}
        samples = torch.arange(X.shape[0], device=X.device)
        # one X-shaped buffer: μ's centred tokens, then (μ computed) the unit rows
        buffer = kept(scratch, "tokens", X.shape, X.dtype, X.device)
        ctx = MetricContext(X, samples, None, RankTolerance(), True, normalise=False, out=buffer)
        if unscaled != ("mu",) and not bool((ctx.row_norms >= torch.finfo(X.dtype).tiny).all()):
            # a zero or subnormal token: the registry's checks, warning and normalised copy
            return out | compute_metrics(X, unscaled, mask=mask)
        if uses_mu:
            ctx.cached("mu_n", lambda: mu_finite(X, out=buffer))
        out.update((n, METRICS[n].fn(ctx)) for n in unscaled)
        return out

    def measure(X, mask, peak, prev=None, layer=None):
        out = measure_state(X, mask, peak)
        for n in step:
            out[n] = (torch.full(X.shape[:1], math.nan, dtype=torch.float64) if prev is None
                      else STEP_METRICS[n].fn(prev, X))
        for n in weighted:
            out[n] = WEIGHT_METRICS[n].fn(X, layer)
        return {n: out[n] for n in names}

    return names, measure, uses_mask


def _measure_at(measure: Callable, X: torch.Tensor, mask, t: int, peak: float | None = None, prev=None,
                layer=None) -> dict:
    """``measure(...)``, with a metric failure naming the layer it happened after."""
    try:
        return measure(X, mask, _peak(X) if peak is None else peak, prev, layer)
    except MetricError as exc:
        raise MetricError(f"after layer {t}: {exc}") from None


def _check_weights(weights: Sequence[LayerWeights], depth: int, d: int) -> None:
    if len(weights) != depth:
        raise ConfigError(f"weights has {len(weights)} layers, depth is {depth}")
    for t, lw in enumerate(weights):
        for name, value in vars(lw).items():
            check_tensor_storage(value, f"layer {t} {name}")
        if lw.W_Q.shape[0] != d or lw.W_K.shape[0] != d or lw.W_V.shape[0] != d:
            raise ConfigError(f"layer {t} weights expect width {lw.W_Q.shape[0]}, X0 has d={d}")
        out = lw.W_V.shape[1] * lw.n_heads // (lw.n_kv_heads or lw.n_heads)
        if (lw.W_O.shape[1] if lw.W_O is not None else out) != d:
            raise ConfigError(f"layer {t} attention output width is not d={d} (W_V/W_O shapes)")


@dataclass(frozen=True)
class ZeroStop:
    """Where a run stopped because X underflowed to the zero matrix in some samples: the
    metrics of ``after_layer`` and later are NaN."""

    after_layer: int
    samples: list[int]
    dtype: str

    def to_dict(self) -> dict:
        return {"after_layer": self.after_layer, "samples": list(self.samples)}

    def message(self, depth: int, float64: str = "dtype=torch.float64") -> str:
        """One line: where, which samples, which layers are not measured (``float64``: how to ask for it)."""
        rest = (f"layer {self.after_layer}" if self.after_layer == depth
                else f"layers {self.after_layer}..{depth}")
        further = (f"; {float64} follows the decay further (it underflows below about 1e-308)"
                   if self.dtype == "float32" else "")
        return (f"after layer {self.after_layer}: X is the zero matrix in samples {self.samples} "
                f"(its entries underflowed to 0 in {self.dtype}): {rest} not measured (NaN){further}")


def _run_layers(X, weights, cfg: BlockConfig, attend: Attention, measure: Callable, metric_mask,
                record_states: bool, bar: Steps | None = None, steps_asked: bool = False):
    """The layer loop: ``(metric rows, states, zero rows per layer, final metrics, ZeroStop)`` (None
    where absent); ``steps_asked``: keep X(t-1). A metric failing on X underflowed to zero ends it."""
    B = X.shape[0]
    peak = _peak(X)
    rows = [_measure_at(measure, X, metric_mask, 0, peak, layer=weights[0])]
    states = [X.cpu()] if record_states else None
    zero_rows: list = []
    final = stop = None
    try:
        with torch.no_grad():
            for t, lw in enumerate(weights):
                prev, prev_peak = (X if steps_asked else None), peak
                X, z = block_forward(X, lw, cfg, attend, peak, layer=t + 1)
                peak = _peak(X)  # the layer's one sync: finiteness, metric dtype, next score bound
                if not math.isfinite(peak):
                    raise ConfigError(f"X has non-finite values after layer {t + 1} (overflow in {X.dtype}); "
                                      "use dtype=torch.float64, a smaller-norm value family, or a normalisation")
                zero_rows.append(z)
                if record_states:
                    states.append(X.cpu())
                try:
                    rows.append(_measure_at(measure, X, metric_mask, t + 1, peak, prev, lw))
                except MetricError:
                    zero = [int(b) for b in torch.nonzero(X.flatten(1).abs().amax(1) == 0).flatten()]
                    # underflow only when the layer before was below sqrt(tiny); else (W_V = 0) an error
                    if not zero or not prev_peak < math.sqrt(torch.finfo(X.dtype).tiny):
                        raise
                    stop = ZeroStop(t + 1, zero, str(X.dtype).replace("torch.", ""))
                    break
                if bar is not None:
                    bar.advance()
            if cfg.final_norm and stop is None:
                Xf, _ = apply_norm(X, cfg)
                final = {k: v.detach().to("cpu", torch.float64).reshape(B)
                         for k, v in _measure_at(measure, Xf, metric_mask, len(weights),
                                                 layer=weights[-1]).items()}
    finally:
        zero_rows = [int(z) for z in zero_rows]
        warn_zero_rows(zero_rows, stacklevel=3)
    if stop is not None:
        warnings.warn(stop.message(len(weights)), RuntimeWarning, stacklevel=3)
    return rows, states, zero_rows, final, stop


_PER_LAYER_OVERHEAD = 4096  # bytes per layer beside its matrices (tensor objects, metric rows): an upper bound


def _check_weight_memory(cfg: BlockConfig, d: int, depth: int, shared: bool, max_memory) -> None:
    """Refuse a run whose drawn float64 weights and per-layer records would not fit, before any is drawn."""
    matrices = 3 + (1 if cfg.out_proj else 0) + (2 * cfg.mlp_ratio if cfg.mlp else 0)
    per_layer = matrices * d * d * 8
    need = (1 if shared else depth) * per_layer + depth * _PER_LAYER_OVERHEAD
    check_memory(need, f"{depth} layers of weights and records at d = {d}", max_memory)


def check_attention_fits(mask, n_samples: int, n_tokens: int, itemsize: int, *, n_heads: int = 1,
                         backend: str = "auto", max_memory=None, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
    """Refuse (``MemoryLimitError``) attention over ``n_tokens`` tokens of ``n_samples`` samples
    that would not fit ``max_memory``, before any token is drawn: the check :func:`simulate` makes
    (dense: three ``(B, H, N, N)`` score arrays and the mask; blocked: three scores per edge, at
    most three chunks a worker thread, and the CSR form)."""
    B, H, N = n_samples, n_heads, n_tokens
    edges = _period(mask, n_tokens)[1].n_edges_hint
    if edges is None:
        edges = N * N  # unknown without building the mask: assume dense
    dense_bytes = B * H * N * N * itemsize
    dense = backend == "dense" or (backend == "auto" and not (edges / N**2 < 0.25 and dense_bytes > _DENSE_SCORE_BUDGET))
    chunk = max(SCORE_BUDGET, B * H * min(N, block_size) * N * itemsize)
    blocked = min(3 * B * H * edges * itemsize, 3 * max(torch.get_num_threads(), 1) * chunk)
    need = 3 * dense_bytes + N * N if dense else blocked + 16 * edges
    check_memory(need, f"attention over N = {N} tokens ({'dense' if dense else 'blocked'} backend, "
                       f"{B} samples x {H} heads)", max_memory)


def _period(mask, n_tokens: int) -> tuple[Any, Mask]:
    """``(schedule or None, the Mask of one period)`` of a mask or schedule spec."""
    sched = parse_schedule(mask, n_tokens) if is_schedule(mask) else None
    return sched, (sched.composed() if sched is not None else resolve_mask(mask, n_tokens))


def _block_of_weights(cfg: BlockConfig, weights: Sequence[LayerWeights], *, value: Any, query_key: Any,
                      shared: bool) -> BlockConfig:
    """``cfg`` with the heads and ``W_O`` of ``weights``; refuses settings they make meaningless."""
    given = [name for name, v in (("value", value), ("query_key", query_key))
             if not (isinstance(v, str) and v == "gaussian")] + (["shared"] if shared else [])
    if given:
        raise ConfigError(f"given weights (weights=) fix every layer's W_Q, W_K, W_V; "
                          f"{', '.join(given)} would be ignored: drop {'it' if len(given) == 1 else 'them'}")
    heads = {int(getattr(lw, "n_heads", 1)) for lw in weights}
    if len(heads) != 1:
        return cfg
    (h,) = heads
    if cfg.n_heads not in (1, h):
        raise ConfigError(f"the block has n_heads={cfg.n_heads} but the given weights have {h} heads; "
                          "leave n_heads at 1")
    out_proj = all(getattr(lw, "W_O", None) is not None for lw in weights)
    return replace(cfg, n_heads=h, out_proj=out_proj)


def simulate(X0, mask, *, run: RunConfig, block: str | BlockConfig = "pure", d_qk: float = 1.0,
             value: MatrixSource = "gaussian", query_key: MatrixSource = "gaussian",
             weights: Sequence[LayerWeights] | None = None, shared: bool = False, metrics=None) -> SimResult:
    """Run ``run.depth`` layers of masked self-attention dynamics from ``X0``.

    Pure SA (spec.md §2): ``X(t+1) = A(t) X(t) W_V(t)``, ``A(t) = softmax_G(X W_Q
    (X W_K)^T / sqrt(d_qk))``; other blocks per :class:`BlockConfig`.

    Parameters
    ----------
    X0 : ``(N, d)`` or ``(B, N, d)`` float tensor or array.
    mask : spec string (``rankcollapse.masks.parse_mask``), ``Mask``, bool ``(N, N)``
        tensor/array, or scipy sparse matrix (True = i attends to j); or a schedule
        (``"schedule:A*k,B"``, a list, a ``MaskSchedule``): layer ``t`` uses mask ``t mod
        period``, metrics and the auto backend see the composed graph of one period.
    run : :class:`RunConfig`: depth, seed, dtype, device, backend, records, progress, memory.
    block : a :class:`BlockConfig` or a preset name of
        :data:`~rankcollapse.dynamics.config.VARIANTS`; recorded as ``variant`` (or ``"custom"``).
    d_qk : temperature > 0: scores ``q k^T / sqrt(d_qk)`` (ignored by layers whose weights
        set ``scale``; docs/dynamics.md relates it to ``d_qk_scale`` and ``beta``).
    value, query_key : weight family spec (:mod:`rankcollapse.dynamics.weights`), a
        ``(d, d)`` matrix for all layers, or a list of ``depth`` matrices.
    weights : per-layer :class:`LayerWeights` (e.g. from
        :func:`rankcollapse.dynamics.pretrained.extract_attention_weights`): they fix
        ``W_Q, W_K, W_V``, the heads and ``W_O``; ``value``, ``query_key``, ``shared`` or
        another head count beside them is refused.
    shared : one layer's drawn weights for all layers.
    metrics : names from ``METRICS`` (default ``("mu", "mu_relative")``), ``STEP_METRICS``
        (NaN in row 0) or ``WEIGHT_METRICS``, or a mapping ``name -> f(X (B, N, d)) -> (B,)``.

    ``run.backend``: ``"dense"``, ``"blocked"`` (windowed kernel, :mod:`.sparse`),
    ``"flex"`` (:class:`.layers.FlexBackend`; no ``record_epsilon``) or ``"auto"`` (blocked
    when the mask's density < 1/4 and the dense scores exceed 64 MiB). ``run.max_memory``
    is checked for the tokens, the drawn weights and the attention before each is allocated.

    Returns
    -------
    SimResult

    Raises
    ------
    ConfigError
        Bad option, shape or device (before any layer runs), sparse or meta tensors, or X
        overflowing to non-finite values (names the layer).
    MemoryLimitError
        The tokens, the weights or the attention would exceed ``run.max_memory``.
    MaskError
        Bad mask or a row with no allowed key.

    See Also
    --------
    rankcollapse.theory.check_collapse_bound : the same run against Theorem 1's envelope.
    rankcollapse.metrics.compute_metrics : the metrics computed after every layer.
    rankcollapse.masks.resolve_mask : the mask forms accepted.

    Examples
    --------
    >>> import torch
    >>> X0 = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> res = simulate(X0, "causal", run=RunConfig(depth=30, seed=0))  # pure self-attention
    >>> res.metrics["mu"].shape  # (depth + 1, B)
    torch.Size([31, 4])
    >>> bool((res.metrics["mu"][-1] < 1e-3 * res.metrics["mu"][0]).all())  # rank collapse
    True
    """
    if not isinstance(run, RunConfig):
        raise ConfigError(f"must be a rankcollapse.dynamics.RunConfig, got {type(run).__name__}", argument="run")
    d_qk = check_float(d_qk, "d_qk", low=0, strict_low=True)
    if not isinstance(shared, bool):  # a truthy "no" would share
        raise ConfigError(f"must be True or False, got {shared!r}", argument="shared")
    X, cfg, layers = _network(X0, block, run, weights, value=value, query_key=query_key, shared=shared)
    if cfg.attention == "uniform":  # W_Q = W_K = 0: a temperature or a W_Q/W_K family changes nothing
        for name, v, default in (("d_qk", d_qk, 1.0), ("query_key", query_key, "gaussian")):
            if not (isinstance(v, type(default)) and v == default):
                raise ConfigError("is ignored by uniform attention (W_Q = W_K = 0): drop it", argument=name)
    scratch: dict = {}  # working arrays of the attention and the metrics, kept across layers
    names, measure, uses_mask = _metric_fn(metrics, scratch)
    m, spec, backend, attend = _attention(mask, X, cfg, layers, run, d_qk, scratch)
    layers = [lw.to(X.dtype, X.device) for lw in layers]
    metric_mask = m.to_dense(X.device) if uses_mask else None  # built once, not per layer
    threads = chunk_threads() if backend == "blocked" and (X.device.type == "cpu") else contextlib.nullcontext()
    with steps(len(layers), "simulate: layers", run.progress) as bar, threads:
        rows, states, zero_rows, final, stop = _run_layers(X, layers, cfg, attend, measure, metric_mask,
                                                           run.record_states, bar,
                                                           steps_asked=any(n in STEP_METRICS for n in names))
    depth, B = run.depth, X.shape[0]
    out = {k: _pad(torch.stack([r[k].detach().to("cpu", torch.float64).reshape(B) for r in rows]), depth + 1)
           for k in names}
    drawn = weights is None
    config = {"variant": variant_name(cfg) or "custom", "block": cfg.to_dict(), "depth": depth,
              "d_qk": d_qk, "value": _source_name(value) if drawn else "given",
              "query_key": _source_name(query_key) if drawn else "given",
              "weights": "family" if drawn else "given", "seed": run.seed,
              "shared": shared, "dtype": str(X.dtype).replace("torch.", ""), "device": str(X.device),
              "backend": backend, "block_size": run.block_size, "mask": spec, "n_tokens": X.shape[1],
              "d_model": X.shape[2], "n_samples": B, "metrics": list(names)}
    return SimResult(metrics=out, config=config,
                     row_mass_deficit=_pad(torch.stack(attend.row_mass), depth) if attend.row_mass else None,
                     epsilon_measured=_pad(torch.stack(attend.epsilon).to("cpu", torch.float64), depth)
                     if run.record_epsilon else None,
                     states=states, attention=[a.cpu() for a in attend.attention] if run.record_attention else None,
                     final_metrics=final, zero_rows=zero_rows, stopped=stop)


def _source_name(source: MatrixSource) -> str:
    return source if isinstance(source, str) else "user"


def _network(X0, block: str | BlockConfig, run: RunConfig, weights: Sequence[LayerWeights] | None, *,
             value: MatrixSource, query_key: MatrixSource, shared: bool
             ) -> tuple[torch.Tensor, BlockConfig, list[LayerWeights]]:
    """The tokens ``(B, N, d)``, the block that runs and every layer's weights (memory checked first)."""
    device = None if run.device is None else check_device(run.device)
    cfg = resolve_variant(block)
    if weights is not None:
        cfg = _block_of_weights(cfg, weights, value=value, query_key=query_key, shared=shared)
    X = _as_tokens(X0, run.dtype, device)
    B, N, d = X.shape
    itemsize = X0.element_size() if isinstance(X0, torch.Tensor) else int(np.asarray(X0).itemsize)
    check_simulate_tokens(B, N, d, X.element_size(), depth=run.depth, record_states=run.record_states,
                          mlp_ratio=cfg.mlp_ratio if cfg.mlp else 0, input_itemsize=itemsize,
                          pure=variant_name(cfg) == "pure", max_memory=run.max_memory)
    if weights is None:
        _check_weight_memory(cfg, d, run.depth, shared, run.max_memory)  # before any layer is drawn
        weights = random_layers(d, run.depth, value=value, query_key=query_key, n_heads=cfg.n_heads,
                                out_proj=cfg.out_proj, mlp_ratio=cfg.mlp_ratio if cfg.mlp else None,
                                shared=shared, seed=run.seed)
    _check_weights(weights, run.depth, d)
    if cfg.mlp and any(lw.W_1 is None for lw in weights):
        raise ConfigError("mlp=True but the given weights carry no MLP (W_1, W_2)")
    return X, cfg, list(weights)


def _attention(mask, X: torch.Tensor, cfg: BlockConfig, weights: Sequence[LayerWeights], run: RunConfig,
               d_qk: float, scratch: dict):
    """``(Mask of one period, recorded mask spec, backend, attention)``; refuses what the backend cannot do."""
    B, N, _ = X.shape
    H = max(lw.n_heads for lw in weights)
    sched, m = _period(mask, N)
    backend, block_size = run.backend, run.block_size
    check_attention_fits(m, B, N, X.element_size(), n_heads=H, backend=backend, max_memory=run.max_memory,
                         block_size=block_size)
    op = parse_attention(cfg.attention)
    if backend == "auto":
        dense_bytes = B * H * N * N * X.element_size()
        # operators other than softmax: dense only
        sparse = m.n_edges / N**2 < 0.25 and dense_bytes > _DENSE_SCORE_BUDGET and op.row_stochastic
        backend = "blocked" if sparse else "dense"
    if backend in ("blocked", "flex") and (run.record_attention or any(lw.position_bias is not None for lw in weights)):
        raise ConfigError("record_attention and position bias (T5) need backend='dense'")
    if backend == "flex" and run.record_epsilon:
        raise ConfigError("record_epsilon needs backend 'dense' or 'blocked' (FlexAttention returns no weights)")
    if not op.row_stochastic and backend in ("blocked", "flex"):
        raise ConfigError(f"{backend!r} cannot run attention {op.spec!r} (the windowed and FlexAttention kernels "
                          "compute softmax); use dense or auto", argument="backend")

    def make_attention(mi: Mask):
        return Attention(mask_dense=mi.to_dense(X.device) if backend == "dense" else None,
                         plan=_plan(mi, block_size, X.device) if backend == "blocked" else None,
                         flex=FlexBackend(mi, X.device) if backend == "flex" else None,
                         make_plan=lambda: _plan(mi, block_size, X.device), d_qk=d_qk,
                         uniform=cfg.attention == "uniform", record_epsilon=run.record_epsilon,
                         record_attention=run.record_attention, operator=None if op.row_stochastic else op,
                         scratch=scratch)

    if sched is None:
        return m, m.spec, backend, make_attention(m)
    return m, sched.spec, backend, ScheduledAttention(sched, make_attention)


def _pad(values: torch.Tensor, n: int) -> torch.Tensor:
    """``values`` ``(k, ...)`` with NaN rows appended up to ``n`` rows (:class:`ZeroStop`)."""
    if values.shape[0] >= n:
        return values
    return torch.cat([values, values.new_full((n - values.shape[0], *values.shape[1:]), math.nan)])


def _plan(m: Mask, block_size: int, device) -> BlockPlan:
    """:class:`BlockPlan` of a mask, from its row intervals when it has them (no CSR form)."""
    if m.intervals is not None:
        return BlockPlan(intervals=m.intervals, block_size=block_size, device=device)
    return BlockPlan(m.to_csr(), block_size=block_size, device=device)
