"""The per-layer results table and its one summariser: statistics over samples.

Every results table (``table.parquet``, :func:`rankcollapse.models.probe`, ``summarise``
of simulations and bounds) has the columns ``layer, point, metric, mean, std, q05, q25,
q50, q75, q95, n_samples[, values]``, one row per (point, metric) (:mod:`rankcollapse.points`).
``std`` has ddof 0, quantiles are ``numpy.quantile``'s linear ones; non-finite values are left
out of the statistics and of ``n_samples``, ``values`` keeps them all in sample order.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from .points import point_after

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
QUANTILE_COLUMNS = ("q05", "q25", "q50", "q75", "q95")
#: Statistic columns, in table order.
STAT_COLUMNS = ("mean", "std") + QUANTILE_COLUMNS + ("n_samples",)
#: The summary layout (without the optional ``values`` column).
SUMMARY_COLUMNS = ("layer", "point", "metric") + STAT_COLUMNS


def exact_stats(value: float, n_samples: int = 1) -> dict[str, Any]:
    """The statistic columns of an exact value (no spread): every quantile the value."""
    v = float(value)
    return {"mean": v, "std": 0.0, **dict.fromkeys(QUANTILE_COLUMNS, v), "n_samples": n_samples}


def as_float64(values: Any) -> np.ndarray:
    """``values`` (a torch tensor on any device, an array, a list) as a float64 numpy array."""
    if hasattr(values, "detach"):  # a torch tensor; torch itself is not imported here
        values = values.detach().cpu().double().numpy()
    return np.asarray(values, dtype=np.float64)


def summarise(values: Any) -> dict[str, np.ndarray]:
    """Statistics over samples of ``values`` ``(L, B)`` or ``(B,)`` (any float dtype, in float64).

    Returns float64 arrays ``(L,)`` ``mean``, ``std``, ``q05`` ... ``q95`` and int64
    ``n_samples`` (finite values per row; 0 with NaN statistics for a row without one).
    """
    v = as_float64(values)
    if v.ndim == 1:
        v = v[None, :]
    finite = np.isfinite(v)
    if not finite.all():  # ±inf is left out like NaN (n_samples counts finite values)
        v = np.where(finite, v, np.nan)
    n = finite.sum(axis=1)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row without a finite value: NaN, counted 0
        out = {"mean": np.nanmean(v, axis=1) if v.size else np.full(v.shape[0], np.nan)}
        out["std"] = np.nanstd(v, axis=1)
        qs = np.full((len(QUANTILES), v.shape[0]), np.nan)
        ordered = np.sort(v, axis=1)  # each row's finite values first (NaN sorts last)
        for k in np.unique(n[n > 0]):  # the rows with k finite values: numpy's quantiles of those
            rows = n == k
            qs[:, rows] = np.quantile(ordered[rows, :k], QUANTILES, axis=1)
        zero, neg = v == 0, np.signbit(v)  # 0.0 and -0.0 tie: which one a quantile gets is numpy's partition's
        for i in np.flatnonzero((zero & neg).any(axis=1) & (zero & ~neg).any(axis=1)):
            qs[:, i] = np.nanquantile(v[i], QUANTILES)
    for name, q in zip(QUANTILE_COLUMNS, qs):
        out[name] = q
    out["n_samples"] = n.astype(np.int64)
    return out


def summary_table(values: Mapping[tuple[int, str, str], Any], *, per_window: bool = False) -> pd.DataFrame:
    """The summary table (:data:`SUMMARY_COLUMNS`, one row per key in key order) of
    ``{(layer, point, metric): values (B,)}`` (arrays, tensors or lists of chunks);
    ``per_window`` adds the column ``values`` (each row's float64 values)."""
    keys = list(values)
    every = [_concat(values[k]) for k in keys]
    cols: dict[str, Any] = {c: np.array([k[i] for k in keys], dtype=object)
                            for i, c in enumerate(("layer", "point", "metric"))}
    cols.update({k: np.zeros(len(keys), np.int64 if k == "n_samples" else np.float64) for k in STAT_COLUMNS})
    for b in {len(e) for e in every}:  # one summarise per sample count, on the rows stacked
        rows = [i for i, e in enumerate(every) if len(e) == b]
        for k, x in summarise(np.stack([every[i] for i in rows])).items():
            cols[k][rows] = x
    if per_window:
        cols["values"] = every
    df = pd.DataFrame(cols, columns=list(SUMMARY_COLUMNS) + (["values"] if per_window else []))
    types = {"layer": np.int64, "n_samples": np.int64, **dict.fromkeys(STAT_COLUMNS[:-1], np.float64)}
    return df.astype(types)


def by_layer(metrics: Mapping[str, Any], *, layers: Sequence[int] | None = None,
             points: Sequence[str] | None = None) -> dict[tuple[int, str, str], np.ndarray]:
    """``{metric: values (L, B)}`` keyed for :func:`summary_table`: row ``i`` at ``layers[i]``
    (default ``i``) and ``points[i]`` (default :func:`rankcollapse.points.point_after`)."""
    out: dict[tuple[int, str, str], np.ndarray] = {}
    for name, vals in metrics.items():
        arr = as_float64(vals)
        arr = arr[:, None] if arr.ndim == 1 else arr
        lay = list(layers) if layers is not None else list(range(arr.shape[0]))
        pts = list(points) if points is not None else [point_after(t) for t in lay]
        for i, (t, p) in enumerate(zip(lay, pts)):
            out[(int(t), p, name)] = arr[i]
    return out


def _concat(v: Any) -> np.ndarray:
    if isinstance(v, (list, tuple)) and v and (hasattr(v[0], "detach") or np.ndim(v[0]) > 0):
        return np.concatenate([as_float64(c).reshape(-1) for c in v])
    return as_float64(v).reshape(-1)
