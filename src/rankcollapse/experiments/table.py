"""The tidy results table shared by every experiment.

One row per (unit, seed, measurement point/layer, metric) with the statistics over
windows of :mod:`rankcollapse.summary` and, in the list column ``values``, the per-window
values in window order (empty for a theory scalar; ``table.csv`` leaves it out).
:data:`CONDITION_COLUMNS` identify one condition; ``sphere_radius`` is the radius of the
sphere SA-LN rows live on (``radius`` alone is the mask graph's).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch

from ..summary import STAT_COLUMNS, by_layer, summarise, summary_table  # noqa: F401  (summarise: re-exported)

KEY_COLUMNS = ("experiment", "model", "mask", "variant", "layer", "metric")
#: Extra columns every row carries (filled with a neutral value where meaningless).
EXTRA_COLUMNS = {
    "source": "",  # simulate | probe | pretrained_sa | theory
    "mask_spec": "",
    "value": "",  # W_V family of simulated networks
    "d_qk": float("nan"),
    "init_scale": float("nan"),
    "seed": -1,  # weight seed; -1 where no random weights are drawn
    "point": "",  # measurement-point name (``embeddings``, ``layer.3.output``, ``final_norm``)
    "setting": "default",  # label of a nearby-setting override (claims follow-up runs)
    "unit": "",  # config hash of the unit that produced the row
    "claims": "",  # nearby-setting rows: ids of the claims that read the unit ("C02,C11")
    "norm": "",  # normalisation of a simulated block (none|sphere|layernorm|rmsnorm)
    "sphere_radius": float("nan"),  # sphere radius R of SA-LN rows: logits scaled by R^2 (1 = unit sphere)
    "depth": -1,  # layers the unit ran (-1: a pretrained model's own depth or a theory check)
    "dtype": "",  # floating-point type of the computation that produced the row; its epsilon is the row's floor
}
#: Columns that together identify one condition (see module docstring).
CONDITION_COLUMNS = ("source", "model", "mask_spec", "variant", "norm", "sphere_radius", "value", "init_scale", "d_qk",
                     "depth", "setting")
COLUMNS = KEY_COLUMNS + tuple(EXTRA_COLUMNS) + STAT_COLUMNS + ("values",)


def rows_from_metrics(metrics: Mapping[str, torch.Tensor | np.ndarray], labels: Mapping[str, Any], *,
                      layers: list[int] | None = None, points: list[str] | None = None) -> pd.DataFrame:
    """Normalised tidy rows from ``{metric: (L, B) values}`` plus constant ``labels``
    (``layers`` default ``0..L-1``, ``points`` those of :func:`rankcollapse.points.point_after`)."""
    return normalise(summary_table(by_layer(metrics, layers=layers, points=points), per_window=True), labels)


def normalise(df: pd.DataFrame, labels: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Add constant ``labels`` and missing columns; fix column order and dtypes."""
    for k, v in (labels or {}).items():
        df[k] = v
    for k, v in {**dict.fromkeys(KEY_COLUMNS, ""), **EXTRA_COLUMNS, **dict.fromkeys(STAT_COLUMNS, np.nan)}.items():
        if k not in df:
            df[k] = 0 if k == "n_samples" else v
    for k in ("layer", "seed", "depth", "n_samples"):
        df[k] = df[k].astype(np.int64)
    for k in ("sphere_radius", "d_qk", "init_scale") + STAT_COLUMNS[:-1]:
        df[k] = df[k].astype(np.float64)
    df["values"] = [_as_values(v) for v in df["values"]] if "values" in df else [np.empty(0)] * len(df)
    for k in ("experiment", "model", "mask", "variant", "metric", "source", "mask_spec", "value", "point", "setting", "unit",
              "norm", "dtype"):
        df[k] = df[k].astype(str)
    df["claims"] = df["claims"].fillna("").astype(str)
    extra = [c for c in df.columns if c not in COLUMNS]
    return df[list(COLUMNS) + extra].reset_index(drop=True)


def _as_values(v: Any) -> np.ndarray:
    """A row's per-window values as a 1-D float64 array; empty for None or NaN."""
    if v is None or (np.ndim(v) == 0 and (not isinstance(v, (int, float, np.number)) or np.isnan(v))):
        return np.empty(0)
    return np.asarray(v, dtype=np.float64).reshape(-1)


def applies(column: str, value: Any) -> bool:
    """Whether a condition column's ``value`` says something (not a neutral filler or ``default``)."""
    if value is None or value == "" or (isinstance(value, (float, np.floating)) and np.isnan(value)):
        return False
    if column in ("depth", "seed") and int(value) < 0:
        return False
    return not (column == "setting" and value == "default")


def column_text(column: str, value: Any) -> str:
    """``column=value``, a float written with ``:g``."""
    return f"{column}={value:g}" if isinstance(value, (float, np.floating)) else f"{column}={value}"


def condition_of(row: Mapping[str, Any]) -> str:
    """Readable label of one condition, e.g. ``source=simulate mask_spec=causal variant=pure``."""
    return " ".join(column_text(k, row.get(k)) for k in CONDITION_COLUMNS if applies(k, row.get(k)))
