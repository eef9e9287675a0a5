"""Rows of the tidy table that a claim's quantity reads: a selection of column values
under one setting (:func:`select_rows`), and the conditions those rows come from
(:func:`conditions`; :data:`~.table.CONDITION_COLUMNS`), of which a quantity takes
exactly one (:func:`one_condition`)."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .table import CONDITION_COLUMNS, condition_of


class AmbiguousSelection(ConfigError):
    """A selection matches rows of more than one condition."""


#: The rows of each (setting, metric) of a table, per table object (rules select hundreds
#: of times within one metric); dropped with its table, rebuilt if its length or columns
#: change; None for a table whose setting or metric column holds a non-string.
_PARTS: dict[int, tuple[weakref.ref, int, tuple, dict | None, dict]] = {}


def _part(table: pd.DataFrame, setting: str, metric: str) -> pd.DataFrame | None:
    """The rows of ``table`` with this setting and metric, in table order."""
    key = id(table)
    entry = _PARTS.get(key)
    if entry is None or entry[0]() is not table or entry[1] != len(table) or entry[2] != tuple(table.columns):
        cols = table[["setting", "metric"]]
        strings = all(isinstance(v, str) for c in cols for v in pd.unique(cols[c]))
        groups = table.groupby(["setting", "metric"], sort=False).indices if strings else None
        entry = (weakref.ref(table, lambda _, k=key: _PARTS.pop(k, None)), len(table), tuple(table.columns), groups, {})
        _PARTS[key] = entry
    groups, parts = entry[3], entry[4]
    if groups is None:
        return None
    if (setting, metric) not in parts:
        idx = groups.get((setting, metric))
        parts[(setting, metric)] = table.iloc[np.sort(idx) if idx is not None else []]
    return parts[(setting, metric)]


def select_rows(table: pd.DataFrame, select: dict[str, Any], setting: str = "default") -> pd.DataFrame:
    """Rows of ``setting`` whose columns equal ``select``'s values (a list = any of;
    floats compared with ``isclose``)."""
    metric = select.get("metric")
    part = _part(table, setting, metric) if isinstance(metric, str) and "metric" in table else None
    if part is not None:  # every row has this setting and metric
        table, select = part, {k: v for k, v in select.items() if k != "metric"}
    keep = (table["setting"] == setting).to_numpy().copy()
    for col, want in select.items():
        if col not in table:
            raise ConfigError(f"selection on unknown column {col!r}")
        wants = want if isinstance(want, list) else [want]
        column = table[col]
        if column.dtype.kind == "f":  # a row matching any of ``wants``
            keep &= np.isclose(column.to_numpy()[:, None], [float(w) for w in wants]).any(axis=1)
        else:
            keep &= column.astype(str).isin([str(w) for w in wants]).to_numpy()
    return table[keep]


def conditions(rows: pd.DataFrame) -> list[str]:
    """Distinct condition labels of ``rows`` (sorted)."""
    cols = [c for c in CONDITION_COLUMNS if c in rows]
    if rows.empty:
        return []
    arrays = [rows[c].to_numpy() for c in cols]
    if all(_constant(v) for v in arrays):  # the usual case, without pandas' hashing
        first = (v[0] for v in arrays)
        return [condition_of({c: v.item() if isinstance(v, np.generic) else v for c, v in zip(cols, first)})]
    keys = rows[cols].drop_duplicates()
    return sorted(condition_of(r) for r in keys.to_dict("records"))


def _constant(v: np.ndarray) -> bool:
    """Whether every entry equals the first (NaN equals NaN), as ``drop_duplicates`` sees it."""
    same = v == v[0]
    if v.dtype.kind == "f":
        same |= np.isnan(v) & np.isnan(v[0])
    return bool(np.all(same))


def one_condition(rows: pd.DataFrame, what: str) -> pd.DataFrame:
    """``rows`` unchanged if they hold one condition; raises :class:`AmbiguousSelection` otherwise."""
    found = conditions(rows)
    if len(found) > 1:
        raise AmbiguousSelection(f"{what} matches {len(found)} conditions, add columns to its select: "
                                 + "; ".join(found))
    return rows
