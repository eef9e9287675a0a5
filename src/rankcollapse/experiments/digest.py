"""Short readings of a run's table for the report: the summary grid of the simulations
and notes on layers where one token dominates ‖X‖_F.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from markupsafe import Markup, escape

from ..metrics.core import DOMINANT_SHARE, dominant_token_text
from .claims import fmt
from .quantities import row_floor
from .table import CONDITION_COLUMNS, applies, column_text


def _ratios(sim: pd.DataFrame, cols: list[str], n_tokens: int | None = None) -> pd.DataFrame:
    """Per condition: μ/‖X‖_F ÷ input at the claim depth and the last layer, and whether each is at the floor."""
    out = []
    for key, g in sim.groupby(cols, dropna=False, sort=True):
        m = g.groupby("layer")["mean"].mean()
        half = int(m.index.max()) // 2
        floor = row_floor(g, "mu_relative", n_tokens)
        deep_input = m.iloc[0]
        if "values" in g:  # a simulate unit's layers beyond D hold its first windows only
            k = int(g.loc[g["layer"] == m.index.max(), "n_samples"].min())
            first = g.loc[g["layer"] == m.index.min(), "values"]
            if k > 0 and (first.map(len) > k).all():
                deep_input = first.map(lambda v: np.mean(v[:k])).mean()
        out.append({**dict(zip(cols, key)), "at_depth": m.loc[half] / m.iloc[0], "at_2x": m.iloc[-1] / deep_input,
                    "t_depth": half, "t_2x": int(m.index.max()), "floor_depth": bool(m.loc[half] <= floor),
                    "floor_2x": bool(m.iloc[-1] <= floor), "dtype": str(g["dtype"].iloc[0]) if "dtype" in g else "",
                    "floor": floor})
    return pd.DataFrame(out)


def summary_grid(table: pd.DataFrame, n_tokens: int | None = None
                 ) -> tuple[pd.DataFrame, list[str], list[str], tuple[int, int] | None]:
    """``(grid, shared, usual, depths)``: the default simulations' μ/‖X‖_F ÷ input, one row per mask spec and one
    column per combination of the other varying condition columns (cells :class:`Cell`); the ``col=value`` of every
    cell, and unless a column says otherwise; ``depths`` when every cell has the same. Empty without simulations."""
    sim = table[(table["source"] == "simulate") & (table["metric"] == "mu_relative") & (table["setting"] == "default")]
    if sim.empty:
        return pd.DataFrame(), [], [], None
    cols = [c for c in CONDITION_COLUMNS if c in sim]
    r = _ratios(sim, cols, n_tokens)
    varying = [c for c in cols if r[c].astype(str).nunique() > 1]
    shared = [column_text(c, r[c].iloc[0]) for c in cols if c not in varying and applies(c, r[c].iloc[0])]
    across = [c for c in varying if c != "mask_spec"]
    for c in list(reversed(across)):  # drop a column the others determine (norm given variant)
        others = [o for o in across if o != c]
        if others and bool((r.astype(str).groupby(others)[c].nunique() <= 1).all()):
            across.remove(c)
    # a column's usual value is said once; a condition's name shows only what differs from it
    usual = {c: r[c].astype(str).mode().iloc[0] for c in across[1:]}
    name = [" · ".join([str(row[across[0]])] + [column_text(c, row[c]) for c in across[1:] if str(row[c]) != usual[c]])
            if across else "μ/‖X‖_F ÷ input" for _, row in r.iterrows()]
    same_t = r["t_depth"].nunique() == 1 and r["t_2x"].nunique() == 1
    cell = [Cell(a, b, fa, fb, *(() if same_t else (int(ta), int(tb))))
            for a, b, fa, fb, ta, tb in r[["at_depth", "at_2x", "floor_depth", "floor_2x", "t_depth", "t_2x"]].to_numpy()]
    r = r.assign(_col=name, _cell=cell, _row=r["mask_spec"] if "mask_spec" in varying else "")
    grid = r.pivot(index="_row", columns="_col", values="_cell")
    from .plots import _ordered  # the paper's order of masks and variants

    grid = grid.reindex(index=_ordered(list(dict.fromkeys(r["_row"])), "mask"),
                        columns=_ordered(list(dict.fromkeys(name)), "variant"))
    grid.index.name, grid.columns.name = "mask", None
    usual_text = [column_text(c, r[c][r[c].astype(str) == usual[c]].iloc[0]) for c in across[1:]
                  if applies(c, r[c][r[c].astype(str) == usual[c]].iloc[0])]
    depths = (int(r["t_depth"].iloc[0]), int(r["t_2x"].iloc[0])) if same_t else None
    grid.attrs["floors"] = {d: float(r.loc[r["dtype"] == d, "floor"].max()) for d in sorted(set(r["dtype"]))
                            if r.loc[r["dtype"] == d, "floor"].max() > 0}
    return grid, shared, usual_text, depths


@dataclass(frozen=True)
class Cell:
    """One grid cell: μ/‖X‖_F ÷ input at the claim depth and 2× depth, at the floor or not."""

    at_depth: float
    at_2x: float
    floor_depth: bool = False
    floor_2x: bool = False
    t_depth: int | None = None
    t_2x: int | None = None


#: Marks a value at or below the floor of its dtype in the summary grid.
FLOOR_MARK = "*"


def cell_text(cell: Any) -> str:
    """``0.012 / 3.4e-16*`` (claim depth / 2× depth; ``*`` = at the floor); ``—`` for no condition."""
    if not isinstance(cell, Cell):
        return "—"
    a = fmt(float(cell.at_depth)) + (FLOOR_MARK if cell.floor_depth else "")
    b = fmt(float(cell.at_2x)) + (FLOOR_MARK if cell.floor_2x else "")
    if cell.t_depth is None:
        return f"{a} / {b}"
    return f"{a} (t = {cell.t_depth}) / {b} (t = {cell.t_2x})"


def _floor_note(grid: pd.DataFrame) -> str:
    cells = [c for c in grid.to_numpy().ravel() if isinstance(c, Cell)]
    if not any(c.floor_depth or c.floor_2x for c in cells):
        return ""
    floors = ", ".join(f"{d} {eps:.3g}" for d, eps in grid.attrs.get("floors", {}).items())
    return (f" {FLOOR_MARK} μ/‖X‖_F at or below the round-off floor 2 (N + d) ε of the dtype its rows were "
            f"computed in ({floors}): collapsed to the floor, its digits are rounding.")


def dominant_token_notes(table: pd.DataFrame) -> list[str]:
    """A note per condition where one token holds more than :data:`DOMINANT_SHARE` of
    ‖X‖_F² (``max_token_share``): the first such layer and how μ/‖X‖_F and μ moved there."""
    rows = table[(table["metric"] == "max_token_share") & (table["setting"] == "default")]
    notes = []
    cols = [c for c in CONDITION_COLUMNS if c in rows]
    for key, g in rows.groupby(cols, dropna=False, sort=True):
        cond = dict(zip(cols, key))
        share = g[g["point"] != "final_norm"].groupby("layer")["mean"].mean().sort_index()
        over = share[share > DOMINANT_SHARE]
        if over.empty:
            continue
        t = int(over.index[0])
        what = " ".join(column_text(c, v) for c, v in cond.items()
                        if c in ("model", "variant", "mask_spec", "source") and applies(c, v))
        per_window = g[(g["layer"] == t) & (g["point"] != "final_norm")]["values"]
        vals = np.concatenate([np.asarray(v, dtype=float) for v in per_window]) if len(per_window) else np.empty(0)
        windows = f" in {int((vals > DOMINANT_SHARE).sum())} of {vals.size} windows" if vals.size else ""
        notes.append(f"{what}: {dominant_token_text(share, windows, _moved(table, cond, cols, t))}")
    return notes


def _moved(table: pd.DataFrame, cond: dict[str, Any], cols: list[str], t: int) -> str:
    """``; at that layer μ/‖X‖_F 0.67 → 0.99, μ 807 → 2.3e+04`` (from layer t − 1 to t)."""
    same = np.ones(len(table), dtype=bool)
    for c in cols:
        v = cond[c]
        same &= table[c].isna().to_numpy() if not applies(c, v) and isinstance(v, float) else (table[c] == v).to_numpy()
    sub = table[same & (table["point"] != "final_norm").to_numpy()]
    bits = []
    for metric, label in (("mu_relative", "μ/‖X‖_F"), ("mu", "μ")):
        m = sub[sub["metric"] == metric].groupby("layer")["mean"].mean()
        if t in m.index and t - 1 in m.index:
            bits.append(f"{label} {fmt(float(m[t - 1]))} → {fmt(float(m[t]))}")
    return f"; at that layer {', '.join(bits)}" if bits and t > 0 else ""


def summary_html(table: pd.DataFrame, n_tokens: int | None = None) -> Markup:
    """The summary grid (:func:`summary_grid`) as an HTML table."""
    grid, shared, usual, depths = summary_grid(table, n_tokens)
    if grid.empty:
        return Markup("<p>No simulation in this run.</p>")
    each = (f"μ/‖X‖_F ÷ input at the claim depth (t = {depths[0]}) / at 2× depth (t = {depths[1]})" if depths
            else "μ/‖X‖_F ÷ input at the claim depth / at 2× depth")
    head = "".join(f"<th>{escape(c)}</th>" for c in grid.columns)
    body = "".join(f"<tr><th>{escape(m)}</th>" + "".join(f"<td>{escape(cell_text(v))}</td>" for v in row) + "</tr>"
                   for m, row in zip(grid.index, grid.to_numpy()))
    notes = f"<p class=\"note\">Every cell: {escape(each)}. Shared by every cell: {escape(', '.join(shared))}."
    if usual:
        notes += f" Unless a column says otherwise: {escape(', '.join(usual))}."
    notes += str(escape(_floor_note(grid)))
    return Markup(f"{notes}</p><table><tr><th>mask</th>{head}</tr>{body}</table>")


def summary_markdown(table: pd.DataFrame, n_tokens: int | None = None) -> str:
    """The summary grid as a Markdown table (empty string without simulations)."""
    grid, shared, usual, depths = summary_grid(table, n_tokens)
    if grid.empty:
        return ""
    each = f"claim depth t = {depths[0]} / 2× depth t = {depths[1]}" if depths else "claim depth / 2× depth"
    lines = [f"μ/‖X‖_F ÷ input ({each}); shared: {', '.join(shared)}"
             + (f"; unless a column says otherwise: {', '.join(usual)}" if usual else "") + _floor_note(grid), "",
             "| mask | " + " | ".join(grid.columns) + " |", "|---|" + "---|" * len(grid.columns)]
    lines += ["| " + " | ".join([str(m)] + [cell_text(v) for v in row]) + " |" for m, row in zip(grid.index, grid.to_numpy())]
    return "\n".join(lines) + "\n"
