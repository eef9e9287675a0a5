"""Quantities the claim rules read from the tidy table, each with bootstrap replicates
(docs/reproduce.md, "Claims").

A quantity is ``{stat, metric, select, ...}`` (:mod:`.claims`) whose rows come from
exactly one condition (:data:`~.table.CONDITION_COLUMNS`; else
:class:`~.selection.AmbiguousSelection`). Per condition the rows give ``V (S, L, W)``: S
weight seeds, L layers, W windows (a row without per-window ``values`` is one window
holding its mean). The point estimate pools seeds and windows; a bootstrap replicate
draws S seeds and W windows with replacement, the draws depending only on the seeds, W
and the resampler's seed, so quantities over the same windows are resampled *paired*.

A relative metric (:data:`FLOOR_METRICS`) at or below the round-off floor of its rows
(:func:`row_floor`) is clipped to it and read as a bound (``Value.bound``); a comparison
combines its sides' bounds (:func:`combine_bounds`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..metrics.floor import FLOOR_METRICS, relative_floor
from ..metrics.rate import least_squares_rate
from .selection import one_condition, select_rows

N_BOOT = 1000


class MissingData(LookupError):
    """The table holds no rows for a quantity's selection (``select`` names it)."""

    def __init__(self, message: str, select: dict[str, Any] | None = None):
        super().__init__(message)
        self.select = dict(select or {})


#: Width d (``hidden_size``) of the packaged models whose embeddings or forward produce rows.
MODEL_WIDTHS = {"minilm": 384, "smollm2": 576}
#: ``(N, d)`` of the theory checks whose rows carry a relative metric: the N = d = 2
#: SA-LN example (docs/theory.md §3a).
THEORY_SHAPES = {"ln_example_basin": (2, 2), "ln_example_outside": (2, 2)}


def row_shape(rows: pd.DataFrame, n_tokens: int | None = None) -> tuple[int | None, int | None]:
    """``(N, d)`` of the computation behind one condition's ``rows`` (None where unknown):
    a theory check's shape, else N from the setting label (``n_tokens=1024,...``) or the
    run's ``n_tokens`` and d from the model (:data:`MODEL_WIDTHS`)."""
    if rows.empty:
        return None, None
    row = rows.iloc[0]
    if str(row.get("source", "")) == "theory":
        return THEORY_SHAPES.get(str(row.get("variant", "")), (None, None))
    label = dict(p.split("=", 1) for p in str(row.get("setting", "")).split(",") if "=" in p)
    n = int(label["n_tokens"]) if "n_tokens" in label else n_tokens
    return n, MODEL_WIDTHS.get(str(row.get("model", "")))


def row_floor(rows: pd.DataFrame, metric: str, n_tokens: int | None = None) -> float:
    """Round-off floor of ``metric`` on one condition's ``rows``:
    :func:`~rankcollapse.metrics.floor.relative_floor` of their ``dtype`` at their N and d
    (:func:`row_shape`) for a relative metric, else 0."""
    if metric not in FLOOR_METRICS or "dtype" not in rows or rows.empty:
        return 0.0
    return relative_floor(str(rows["dtype"].iloc[0]), *row_shape(rows, n_tokens))


@dataclass
class EvalContext:
    """How rules are read: claim ``depth`` D (``layer: last`` of a simulated network is
    min(D, deepest)), ``layer_factor`` on explicit simulated layers (2 for the depth
    check), the run's ``n_tokens`` (for the floors), the bootstrap's ``n_boot`` and ``seed``."""

    depth: int | None = None
    layer_factor: int = 1
    n_tokens: int | None = None
    n_boot: int = N_BOOT
    seed: int = 0
    _cache: dict = field(default_factory=dict)

    def window_counts(self, w: int) -> np.ndarray:
        key = ("w", w)
        if key not in self._cache:
            rng = np.random.default_rng([self.seed, 1, w])
            self._cache[key] = _counts(rng.integers(0, w, size=(self.n_boot, w)), w)
        return self._cache[key]

    def seed_counts(self, seeds: tuple[int, ...]) -> np.ndarray:
        key = ("s", seeds)
        if key not in self._cache:
            s = len(seeds)
            if s == 1:
                self._cache[key] = np.ones((self.n_boot, 1))
            else:
                rng = np.random.default_rng([self.seed, 2, zlib.crc32(repr(seeds).encode())])
                self._cache[key] = _counts(rng.integers(0, s, size=(self.n_boot, s)), s)
        return self._cache[key]


def _counts(idx: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((idx.shape[0], n))
    np.add.at(out, (np.arange(idx.shape[0])[:, None], idx), 1.0)
    return out


#: A bound mirrored (``upper``: true value <= the number shown, ``lower``: >=).
_FLIP = {"upper": "lower", "lower": "upper", "undecidable": "undecidable", None: None}


def combine_bounds(num: str | None, den: str | None) -> str | None:
    """Bound of ``num / den`` or ``num - den``: the second side's bound flips; two
    opposite bounds, or an undecidable side, give ``undecidable``."""
    a, b = num, _FLIP[den]
    if a is None or b is None or a == b:
        return a or b
    return "undecidable"


@dataclass
class Value:
    """A quantity: point estimate, bootstrap replicates ``(n_boot,)``, per-seed values.

    ``bound``: None, ``upper``, ``lower`` or ``undecidable``; ``floor``: the rows' round-off
    floor; ``live``: layers up to the read one whose mean is above the floor (value and
    change only); ``dtype``: the rows' compute dtype."""

    point: float
    reps: np.ndarray
    per_seed: dict[int, float]
    collapsed: bool = False
    n_samples: int = 0
    n_seeds: int = 0
    bound: str | None = None
    floor: float = 0.0
    live: tuple[int, ...] | None = None
    dtype: str = ""
    finite_depth: str = ""

    @staticmethod
    def const(x: float, n_boot: int) -> "Value":
        return Value(float(x), np.full(n_boot, float(x)), {-1: float(x)})

    @staticmethod
    def of(vals: np.ndarray, seeds: tuple[int, ...], **kw: Any) -> "Value":
        """Point, replicates and per-seed values of ``vals (1 + S + n_boot,)`` (the rows of :func:`_condition`)."""
        return Value(float(vals[0]), vals[1 + len(seeds):], {s: float(vals[1 + i]) for i, s in enumerate(seeds)},
                     n_seeds=len([s for s in seeds if s >= 0]), **kw)


def _paired(a: Value, b: Value, op) -> dict[int, float]:
    """``op`` of two quantities' per-seed values, seed by seed (-1: a value for every seed)."""
    seeds = sorted((set(a.per_seed) | set(b.per_seed)) - {-1}) or [-1]
    get = lambda v, s: v.per_seed.get(s, v.per_seed.get(-1, np.nan))  # noqa: E731
    return {s: float(op(get(a, s), get(b, s))) for s in seeds}


def curve(rows: pd.DataFrame) -> tuple[np.ndarray, tuple[int, ...], np.ndarray]:
    """``(layers (L,), seeds, V (S, L, W))`` of one condition's rows of one metric."""
    layers = np.array(sorted(rows["layer"].unique()), dtype=np.int64)
    seeds = tuple(sorted(int(s) for s in rows["seed"].unique()))
    has = rows["values"].map(len) > 0 if "values" in rows else pd.Series(False, index=rows.index)
    w = int(rows.loc[has, "values"].map(len).max()) if has.any() else 1
    V = np.full((len(seeds), len(layers), w), np.nan)
    li = {int(l): i for i, l in enumerate(layers)}
    si = {s: i for i, s in enumerate(seeds)}
    for seed, layer, mean, vals in zip(rows["seed"], rows["layer"], rows["mean"],
                                       rows["values"] if "values" in rows else [()] * len(rows)):
        v = np.asarray(vals, dtype=np.float64) if len(vals) else np.array([mean], dtype=np.float64)
        V[si[int(seed)], li[int(layer)], : len(v)] = v
        if not len(vals):
            V[si[int(seed)], li[int(layer)], :] = mean
    return layers, seeds, V


def layer_means(V: np.ndarray, cs: np.ndarray, cw: np.ndarray) -> np.ndarray:
    """Weighted mean over seeds and windows: ``(R, L)`` for weights ``cs (R, S)``, ``cw (R, W)``;
    non-finite values are left out."""
    ok = np.isfinite(V)
    num = np.einsum("rs,slw,rw->rl", cs, np.where(ok, V, 0.0), cw)
    den = np.einsum("rs,slw,rw->rl", cs, ok.astype(np.float64), cw)
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def evaluate(table: pd.DataFrame, q: dict[str, Any], setting: str, ctx: EvalContext) -> Value:
    """Evaluate quantity ``q`` (see :mod:`.claims`) under ``setting``.

    Raises
    ------
    MissingData
        No rows for the selection, or a layer the rows do not have.
    AmbiguousSelection
        The selection matches rows of more than one condition.
    ConfigError
        Unknown stat.
    """
    if "const" in q:
        return Value.const(q["const"], ctx.n_boot)
    stat = q.get("stat", "value")
    if stat in ("ratio", "difference"):
        a, b = evaluate(table, q["num"], setting, ctx), evaluate(table, q["den"], setting, ctx)
        op = np.divide if stat == "ratio" else np.subtract
        with np.errstate(all="ignore"):
            per = _paired(a, b, op)
            return Value(float(op(a.point, b.point)), op(a.reps, b.reps), per, a.collapsed and b.collapsed,
                         max(a.n_samples, b.n_samples), max(a.n_seeds, b.n_seeds),
                         bound=combine_bounds(a.bound, b.bound), floor=max(a.floor, b.floor),
                         finite_depth="; ".join(x for x in (a.finite_depth, b.finite_depth) if x))
    if stat == "envelope_rate":
        return Value.const(_envelope_rate(q), ctx.n_boot)
    if stat == "spearman":
        return _spearman(table, q, setting, ctx)
    if stat == "profile_spearman":
        return _profile_spearman(table, q, setting, ctx)
    sel = dict(q.get("select", {}))
    rows, layers, seeds, M, W = _condition(table, q["metric"], sel, setting, ctx)
    # an explicit floor for an absolute metric (theory μ)
    floor = max(row_floor(rows, q["metric"], ctx.n_tokens), float(q.get("floor", 0.0)))
    collapsed = M[0] <= floor
    if floor:
        M = np.maximum(M, floor)
    simulated = "depth" in rows and int(rows["depth"].iloc[0]) >= 0
    if stat in ("min", "max") and "where" in q:  # only the layers where another metric passes a bound
        q = {**q, "_layers": _layers_where(table, q, sel, setting, ctx)}
    vals, hit = _stat(M, layers, q, stat, ctx, simulated, floor)
    at_floor = bool(collapsed[hit].all()) if hit is not None else False
    if stat in ("min", "max") and floor and vals[0] <= floor:
        at_floor = True  # the extreme over layers sits at the floor: at most the floor
    bound = "upper" if at_floor else None
    if stat == "change" and collapsed[_index(layers, q.get("from", 0), ctx, simulated)]:
        bound = combine_bounds(bound, "upper")  # a reference layer at its floor: at least, or undecidable
    live = None if hit is None else tuple(int(t) for t in layers[(~collapsed) & (layers <= layers[hit[0]])])
    return Value.of(vals, seeds, collapsed=at_floor, n_samples=W, bound=bound, floor=floor, live=live,
                    dtype=str(rows["dtype"].iloc[0]) if "dtype" in rows else "",
                    finite_depth=_finite_depth(q, sel, layers, ctx, simulated) if stat == "rate" else "")


def _finite_depth(q: dict[str, Any], sel: dict[str, Any], layers: np.ndarray, ctx: EvalContext, simulated: bool) -> str:
    """The note on a rate fitted under a causal mask (docs/reproduce.md, "Finite-depth rates")."""
    spec = str(sel.get("mask_spec", ""))
    if not spec.startswith("causal"):
        return ""
    top = _index(layers, q.get("to", "last"), ctx, simulated)
    start = int(q.get("from_layer", 1))
    return (f"finite-depth reading: rate over layers {start}..{int(layers[top])} under {spec} (every causal "
            "averaging matrix has second eigenvalue 1/2; the fitted rate depends on the layers fitted)")


def _envelope_rate(q: dict[str, Any]) -> float:
    """:func:`rankcollapse.theory.envelope.envelope_rate` of ``select.mask_spec`` at ``n_tokens``."""
    from ..theory.envelope import envelope_rate

    spec = q.get("select", {}).get("mask_spec")
    if not spec or "n_tokens" not in q:
        raise ConfigError(f"envelope_rate needs select.mask_spec and n_tokens, got {q}")
    return envelope_rate(str(spec), n_tokens=int(q["n_tokens"]))


def _index(layers: np.ndarray, layer: Any, ctx: EvalContext, simulated: bool) -> int:
    if layer == "last":
        top = int(layers.max())
        want = min(top, int(ctx.depth)) if simulated and ctx.depth else top
    else:
        want = int(layer) * (ctx.layer_factor if simulated else 1)
    hit = np.flatnonzero(layers == want)
    if not hit.size:
        raise MissingData(f"layer {want} not in the rows (have {layers.min()}..{layers.max()})")
    return int(hit[0])


def _stat(M: np.ndarray, layers: np.ndarray, q: dict[str, Any], stat: str, ctx: EvalContext, simulated: bool,
          floor: float) -> tuple[np.ndarray, Any]:
    """``stat`` of every row of ``M (R, L)``, and the layers whose collapse collapses it (or None)."""
    if stat == "value":
        i = _index(layers, q.get("layer", "last"), ctx, simulated)
        return M[:, i], [i]
    if stat == "change":
        i, j = _index(layers, q.get("layer", "last"), ctx, simulated), _index(layers, q.get("from", 0), ctx, simulated)
        with np.errstate(all="ignore"):
            return M[:, i] / M[:, j], [i]
    if stat in ("min", "max"):
        keep = layers >= int(q.get("from_layer", 0))
        top = _index(layers, q.get("to", "last"), ctx, simulated)
        keep &= np.arange(len(layers)) <= top
        if "_layers" in q:
            keep &= np.isin(layers, q["_layers"])
            if not keep.any():
                w = q["where"]
                raise MissingData(f"{stat} of {q['metric']}: no layer where {w.get('metric')} {w.get('op', '>=')} "
                                  f"{w.get('value')}", q.get("select"))
        return getattr(np, f"nan{stat}")(M[:, keep], axis=1), None
    if stat == "rate":
        return _rate(M, layers, q, ctx, simulated, floor), None
    if stat == "turn":
        return _turn(M, layers, q), None
    raise ConfigError(f"unknown quantity stat {stat!r}; use value, change, min, max, rate, turn, spearman, "
                      "profile_spearman, envelope_rate, ratio or difference")


def _turn(M: np.ndarray, layers: np.ndarray, q: dict[str, Any]) -> np.ndarray:
    """``min(max_l s_l, 1 / min_l s_l)`` of the steps ``s_l = M[l] / M[l - 1]`` from ``from_layer`` (default 0)."""
    keep = layers >= int(q.get("from_layer", 0))
    if keep.sum() < 3:
        raise MissingData(f"turn of {q['metric']}: fewer than 3 layers", q.get("select"))
    V = M[:, keep]
    with np.errstate(all="ignore"):
        steps = V[:, 1:] / V[:, :-1]
        return np.minimum(np.nanmax(steps, axis=1), 1.0 / np.nanmin(steps, axis=1))


def _rate(M: np.ndarray, layers: np.ndarray, q: dict[str, Any], ctx: EvalContext, simulated: bool,
          floor: float) -> np.ndarray:
    """Per-layer rate ``exp(slope)`` of ``log M`` over ``from_layer`` (1) .. ``last``, where ``M[0]`` is above the floor."""
    top = _index(layers, q.get("to", "last"), ctx, simulated)
    start = int(q.get("from_layer", 1)) * (ctx.layer_factor if simulated and q.get("scale_from", False) else 1)
    window = (layers >= start) & (np.arange(len(layers)) <= top)
    fit = least_squares_rate(M[:, window].T, floor=max(floor, 0.0), layers=layers[window], shared=True)
    if fit.n_layers[0] < 2:
        raise MissingData(f"rate of {q['metric']}: fewer than 2 layers above the floor {floor:g} "
                          f"in {start}..{layers[top]}")
    return fit.rate


_WHERE_OPS = {">=": np.greater_equal, ">": np.greater, "<=": np.less_equal, "<": np.less}


def _condition(table: pd.DataFrame, metric: str, sel: dict[str, Any], setting: str, ctx: EvalContext
               ) -> tuple[pd.DataFrame, np.ndarray, tuple[int, ...], np.ndarray, int]:
    """``(rows, layers (L,), seeds, M (1 + S + n_boot, L), W)``: one condition's rows of
    ``metric`` (``final_norm`` only if selected) and their per-layer means: point
    estimate, one per seed, then the bootstrap replicates; ``W`` windows, 0 for rows without
    per-window values. Raises :class:`MissingData`."""
    rows = select_rows(table, {**sel, "metric": metric}, setting)
    if "point" not in sel:
        rows = rows[rows["point"] != "final_norm"]
    if rows.empty:
        raise MissingData(f"no rows for metric={metric} " + ", ".join(f"{k}={v}" for k, v in sel.items())
                          + (f" (setting {setting})" if setting != "default" else ""), sel)
    one_condition(rows, f"selection {sel} of metric {metric}")
    layers, seeds, V = curve(rows)
    V = V[:, :, :_windows_to_depth(rows, ctx)]
    S, _, W = V.shape
    cs = np.vstack([np.ones((1, S)), np.eye(S), ctx.seed_counts(seeds)])
    cw = np.vstack([np.ones((1 + S, W)), ctx.window_counts(W) if W > 1 else np.ones((ctx.n_boot, 1))])
    has_values = bool(rows["values"].map(len).max()) if "values" in rows else False
    return rows, layers, seeds, layer_means(V, cs, cw), W if has_values else 0


def _windows_to_depth(rows: pd.DataFrame, ctx: EvalContext) -> int | None:
    """Windows every simulated row up to ``ctx.depth`` holds (None: all), so every layer read averages the same windows."""
    if ctx.depth is None or "depth" not in rows or "values" not in rows or int(rows["depth"].iloc[0]) < 0:
        return None
    counts = rows.loc[rows["layer"] <= ctx.depth, "values"].map(len)
    counts = counts[counts > 0]
    return int(counts.min()) if len(counts) else None


def _layers_where(table: pd.DataFrame, q: dict[str, Any], sel: dict[str, Any], setting: str, ctx: EvalContext
                  ) -> np.ndarray:
    """Layers whose point estimate of ``where.metric`` (same condition) passes the bound."""
    where = q["where"]
    op = where.get("op", ">=")
    if op not in _WHERE_OPS or "metric" not in where or "value" not in where:
        raise ConfigError(f"where needs metric, value and op in {list(_WHERE_OPS)}, got {where}")
    _, layers, _, M, _ = _condition(table, str(where["metric"]), sel, setting, ctx)
    return layers[_WHERE_OPS[op](M[0], float(where["value"]))]


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's ρ of every row pair of ``x, y (R, L)`` over their finite pairs
    (:func:`rank_correlation`); NaN for a row with fewer than 3 finite pairs or a constant row."""
    out = np.full(x.shape[0], np.nan)
    full = np.isfinite(x).all(axis=1) & np.isfinite(y).all(axis=1)
    if x.shape[1] >= 3 and full.any():  # rows without a gap at once
        out[full] = rank_correlation(x[full], y[full])
    for r in np.flatnonzero(~full):
        ok = np.isfinite(x[r]) & np.isfinite(y[r])
        if ok.sum() >= 3:
            out[r] = rank_correlation(x[r, ok], y[r, ok])
    return out


def _spearman(table: pd.DataFrame, q: dict[str, Any], setting: str, ctx: EvalContext) -> Value:
    """ρ across layers ``from_layer`` (0) .. the deepest both curves have, for every bootstrap draw."""
    sel = dict(q.get("select", {}))
    other = str(q.get("with", "layer"))
    _, layers, seeds, M, W = _condition(table, q["metric"], sel, setting, ctx)
    if other == "layer":
        common, X, Y = layers, M, np.broadcast_to(layers.astype(np.float64), M.shape)
    else:
        _, layers2, _, M2, W2 = _condition(table, other, sel, setting, ctx)
        if M2.shape[0] != M.shape[0] or W2 != W:
            raise ConfigError(f"spearman of {q['metric']} with {other}: the two metrics have different windows or seeds")
        common = np.intersect1d(layers, layers2)
        X, Y = M[:, np.isin(layers, common)], M2[:, np.isin(layers2, common)]
    keep = common >= int(q.get("from_layer", 0))
    if keep.sum() < 3:
        raise MissingData(f"spearman of {q['metric']} with {other}: fewer than 3 layers", sel)
    return Value.of(spearman_rows(np.asarray(X)[:, keep], np.asarray(Y)[:, keep]), seeds, n_samples=W)


#: Reductions of per-layer profile correlations (``over``).
PROFILE_OVER = ("median", "min", "max")


def _profile_means(table: pd.DataFrame, metric: str, sel: dict[str, Any], setting: str, ctx: EvalContext
                   ) -> tuple[np.ndarray, np.ndarray, int]:
    """``(layers (L,), M (1 + 1 + n_boot, L, J), W)``: one condition's per-position rows averaged over windows."""
    rows = select_rows(table, {**sel, "metric": metric}, setting)
    rows = rows[rows["point"].str.startswith("position.")]
    if rows.empty:
        raise MissingData(f"no per-position rows for metric={metric} " + ", ".join(f"{k}={v}" for k, v in sel.items()), sel)
    one_condition(rows, f"selection {sel} of metric {metric}")
    if rows["seed"].nunique() > 1:
        raise ConfigError(f"profile_spearman of {metric}: rows of {rows['seed'].nunique()} seeds; select one")
    layers = np.array(sorted(rows["layer"].unique()), dtype=np.int64)
    pos = rows["point"].str.slice(len("position.")).astype(np.int64).to_numpy()
    n_pos = int(pos.max()) + 1
    w = max(int(rows["values"].map(len).max()), 1)
    V = np.full((len(layers), n_pos, w), np.nan)
    li = np.searchsorted(layers, rows["layer"].to_numpy())
    for i, j, mean, vals in zip(li, pos, rows["mean"], rows["values"]):
        V[i, j, :] = vals if len(vals) else mean
    cw = np.vstack([np.ones((2, w)), ctx.window_counts(w) if w > 1 else np.ones((ctx.n_boot, 1))])
    ok = np.isfinite(V)
    with np.errstate(invalid="ignore", divide="ignore"):
        M = np.einsum("rw,ljw->rlj", cw, np.where(ok, V, 0.0)) / np.einsum("rw,ljw->rlj", cw, ok.astype(np.float64))
    return layers, M, (w if w > 1 else 0)


def rank_correlation(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's ρ along the last axis of finite ``x, y (..., J)``: the Pearson
    correlation of their ranks (ties share their mean rank). NaN where a side is constant."""
    from scipy.stats import rankdata

    a, b = rankdata(x, axis=-1), rankdata(y, axis=-1)
    a, b = a - a.mean(-1, keepdims=True), b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (a * b).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def _profile_spearman(table: pd.DataFrame, q: dict[str, Any], setting: str, ctx: EvalContext) -> Value:
    """ρ across positions per layer, at ``layer`` or reduced by ``over`` where the ``against`` profile ranks something."""
    from ..masks.influence import ranks_something

    sel = dict(q.get("select", {}))
    other = {**sel, **dict(q.get("against") or {})}
    layers, X, W = _profile_means(table, q["metric"], sel, setting, ctx)
    layers2, Y, W2 = _profile_means(table, q["metric"], other, setting, ctx)
    if X.shape[2] != Y.shape[2]:
        raise ConfigError(f"profile_spearman: {X.shape[2]} positions against {Y.shape[2]}")
    if W and W2 and W != W2:
        raise ConfigError(f"profile_spearman: the two profiles have {W} and {W2} windows")
    common = np.intersect1d(layers, layers2)
    X, Y = X[:, np.isin(layers, common)], Y[:, np.isin(layers2, common)]
    rho = rank_correlation(X, Y)  # (R, L)
    ranks = np.array([ranks_something(Y[0, k]) for k in range(len(common))])
    rho[:, ~ranks] = np.nan
    if "layer" in q and q["layer"] is not None:
        want = int(common.max()) if q["layer"] == "last" else int(q["layer"])
        if want not in common:
            raise MissingData(f"profile_spearman of {q['metric']}: layer {want} not in the rows", sel)
        vals = rho[:, int(np.flatnonzero(common == want)[0])]
    else:
        over = q.get("over", "median")
        if over not in PROFILE_OVER:
            raise ConfigError(f"profile_spearman: over must be one of {', '.join(PROFILE_OVER)}, got {over!r}")
        keep = (common >= int(q.get("from_layer", 0) or 0)) & ranks
        if not keep.any():
            raise MissingData(f"profile_spearman of {q['metric']}: no layer where the {other} profile ranks anything", sel)
        with np.errstate(all="ignore"):
            vals = getattr(np, f"nan{over}")(rho[:, keep], axis=1)
    return Value(float(vals[0]), vals[2:], {-1: float(vals[1])}, False, max(W, W2), 0)
