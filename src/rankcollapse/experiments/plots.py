"""Figures from the tidy table, declared in the configs' ``plots`` lists.

One panel per value of ``panels``, one line per condition (:data:`~.table.CONDITION_COLUMNS`:
named by ``lines`` plus every condition column that differs, never averaged together);
the caption ends with the columns every line shares ("Drawn: ..."). A line is the mean
over windows, its band the inter-quartile range; on a log axis values <= 0 are drawn at a
marked floor a decade below the smallest positive value. ``x: position`` draws
per-position profiles (:func:`draw_profiles`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.ticker
import numpy as np
import pandas as pd

from .._figure import colour, new_figure, save_figure
from .._validate import Spec
from ..errors import ConfigError
from .selection import select_rows
from .table import CONDITION_COLUMNS, applies, condition_of

METRIC_LABELS = {"mu": "μ(X) = ‖X − 1γ_X‖_F", "mu_relative": "μ(X) / ‖X‖_F",
                 "avg_abs_cos": "average |cos| over token pairs", "rank_fraction": "numerical rank / min(N, d)",
                 "sigma_min": "σ_min(X)", "sigma_ratio": "σ₂ / σ₁"}
#: Readable names of source values used as panel titles.
PANEL_NAMES = {"probe": "full pretrained model", "pretrained_sa": "attention-only network (no LN, skip, MLP)",
               "simulate": "random-init network"}
#: Floor for values <= 0 on a log axis when a figure has no positive value at all.
LOG_FLOOR = 1e-17
_LINE_ORDER = {"mask": ["complete", "causal", "sliding_window", "causal_sliding_window"],
               "variant": ["pure", "sphere", "layernorm", "skip", "post_ln", "full", "drop_norm"]}


def make_plots(table: pd.DataFrame, configs: list[dict[str, Any]], folder: Path) -> dict[str, dict[str, str]]:
    """Draw every declared plot that has rows; returns ``{id: {path, title, caption}}``."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, dict[str, str]] = {}
    for cfg in configs:
        for spec in cfg.get("plots", []):
            if spec["id"] in out:
                continue
            fig = draw(table, spec)
            if fig is None:
                continue
            drawn = drawn_text(table, spec)
            path = save_figure(fig, folder / f"{spec['id']}.png", dpi=110, bbox_inches="tight")
            caption = (spec.get("caption", "") + (f" Drawn: {drawn}." if drawn else "")).strip()
            out[spec["id"]] = {"path": str(path), "title": spec["title"], "caption": caption,
                               "experiment": cfg["name"], "aliases": list(spec.get("aliases", []))}
    return out


def _num(v: Any) -> str:
    """Legend value: ``0.015625`` -> ``1/64``, ``32.0`` -> ``32``."""
    if isinstance(v, (float, np.floating)) and 0 < v < 1 and float(1 / v).is_integer():
        return f"1/{int(1 / v)}"
    return f"{v:g}" if isinstance(v, (float, np.floating)) else str(v)


def _ordered(values: list[Any], key: str) -> list[Any]:
    """Known families (of a label's first part) first in the paper's order, the rest sorted."""
    order = _LINE_ORDER.get(key, [])
    rank = {v: i for i, v in enumerate(order)}
    fam = lambda v: Spec.name_of(str(v).split(" · ")[0])  # noqa: E731
    return sorted(values, key=lambda v: (rank.get(fam(v), len(order)), str(type(v)), v))


def _rows(table: pd.DataFrame, spec: dict[str, Any]) -> pd.DataFrame:
    return select_rows(table, {**spec.get("select", {}), "metric": spec["metric"]}, "default")


def _varying(rows: pd.DataFrame, skip: set[str]) -> list[str]:
    """Condition columns (besides ``skip``) that take more than one value in ``rows``."""
    return [c for c in CONDITION_COLUMNS if c in rows and c not in skip and rows[c].astype(str).nunique() > 1]


def _within_panels(rows: pd.DataFrame, panel_key: str | None, skip: set[str]) -> list[str]:
    """Condition columns (besides ``skip``) that vary inside at least one panel."""
    if not panel_key:
        return _varying(rows, skip)
    inside = {c for _, g in rows.groupby(panel_key, sort=False) for c in _varying(g, skip)}
    return [c for c in CONDITION_COLUMNS if c in inside]


def drawn_text(table: pd.DataFrame, spec: dict[str, Any]) -> str:
    """The condition columns every line of the figure shares, e.g. ``value=gaussian, d_qk=1``."""
    rows = _rows(table, spec)
    if rows.empty:
        return ""
    return ", ".join(f"{c}={_num(rows[c].iloc[0])}" for c in CONDITION_COLUMNS if c in rows and c != "setting"
                     and rows[c].astype(str).nunique(dropna=False) == 1 and applies(c, rows[c].iloc[0]))


def _log_floor(rows: pd.DataFrame) -> float:
    v = rows[["mean", "q25", "q75"]].to_numpy(dtype=float).ravel()
    v = v[np.isfinite(v) & (v > 0)]
    return float(10 ** np.floor(np.log10(v.min()) - 1)) if v.size else LOG_FLOOR


def draw(table: pd.DataFrame, spec: dict[str, Any], *, ax: Any = None):
    """One figure for ``spec`` or None without matching rows; ``ax``: axes to draw on (one
    per panel), by default a new pyplot-free figure."""
    rows = _rows(table, spec)
    if rows.empty:
        return None
    if spec.get("x") == "position":
        return draw_profiles(rows, spec, ax=ax)
    panel_key, line_key = spec.get("panels"), "mask_spec" if spec["lines"] == "mask" else spec["lines"]
    panels = _ordered(list(rows[panel_key].unique()), panel_key) if panel_key else [None]
    log = spec.get("yscale", "log") == "log"
    floor = _log_floor(rows) if log else None
    sharey = spec.get("sharey", "auto")
    if sharey == "auto":
        sharey = _share_y(rows, panel_key, panels, log)
    fig, axes = _figure(spec, len(panels), ax, (3.6, 3.1), sharey=bool(sharey))
    if axes.size < len(panels):
        raise ConfigError(f"plot {spec.get('id', '')!r} has {len(panels)} panels; ax= gave {axes.size} axes")
    loglog = bool(spec.get("loglog", False))
    extra = _within_panels(rows, panel_key, {line_key, spec["lines"], "mask", panel_key or ""})
    rows = rows.assign(_line=[_label(r, line_key, extra, spec) for r in rows[[line_key] + extra].to_dict("records")])
    lines = _ordered(list(rows["_line"].unique()), spec["lines"])
    styles = _styles(rows, line_key, extra, lines)
    any_floor = False
    for ax, panel in zip(axes.flat, panels):
        sub = rows if panel is None else rows[rows[panel_key] == panel]
        for value in lines:
            any_floor |= _line(ax, sub[sub["_line"] == value], value, styles[value], loglog, spec, floor)
        if panel is not None:
            ax.set_title(f"{spec.get('panel_label', panel_key)}: {PANEL_NAMES.get(str(panel), panel)}", fontsize=10)
        ax.set_xlabel(spec.get("xlabel", "layer t"))
        ax.set_yscale(spec.get("yscale", "log"))
        if loglog:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="major", alpha=0.3)
    if any_floor:
        for ax in axes.flat[:len(panels)]:
            ax.axhline(floor, color="0.5", ls=":", lw=0.8, label=f"values ≤ 0, drawn at {floor:g}")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(spec.get("ylabel", METRIC_LABELS.get(spec["metric"], spec["metric"])))
    legend: dict[str, Any] = {}  # every panel's entries (a line may exist in one panel only)
    for ax in axes.flat[:len(panels)]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(lab, h)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                   title=spec.get("legend_title", spec["lines"]))
    fig.suptitle(spec["title"], fontsize=11)
    fig.tight_layout()
    return fig


def _figure(spec: dict[str, Any], n_panels: int, ax: Any, size: tuple[float, float], sharey: bool = False):
    """``(figure, axes (rows, cols))`` for ``n_panels`` panels: the given ``ax``, or a new pyplot-free figure."""
    if ax is not None:
        axes = np.asarray(ax, dtype=object).reshape(1, -1)
        return axes.flat[0].figure, axes
    ncol = min(n_panels, int(spec.get("ncols", 2)))
    nrow = int(np.ceil(n_panels / ncol))
    fig = new_figure((size[0] * ncol, size[1] * nrow))
    return fig, fig.subplots(nrow, ncol, squeeze=False, sharey=sharey)


def _label(rec: dict[str, Any], line_key: str, extra: list[str], spec: dict[str, Any]) -> str:
    head = f"{spec['line_label']}={_num(rec[line_key])}" if spec.get("line_label") else _num(rec[line_key])
    return " · ".join([head] + [f"{c}={_num(rec[c])}" for c in extra])


#: Line styles and markers cycled with the colours, so that coinciding lines stay visible.
_DASHES = ("-", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (3, 1, 1, 1, 1, 1)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _styles(rows: pd.DataFrame, line_key: str, extra: list[str], lines: list[str]) -> dict[str, dict[str, Any]]:
    """Style of each line label: colour by ``line_key`` value, dashes by the ``extra`` columns."""
    first = rows.drop_duplicates("_line").set_index("_line")
    keys = _ordered(list(dict.fromkeys(first.loc[lines, line_key])), "mask" if line_key == "mask_spec" else line_key)
    combos = list(dict.fromkeys(tuple(str(first.at[v, c]) for c in extra) for v in lines))
    out = {}
    for v in lines:
        i = keys.index(first.at[v, line_key])
        st = {"color": colour(i), "ls": _DASHES[i % len(_DASHES)], "marker": _MARKERS[i % len(_MARKERS)],
              "lw": max(2.6 - 0.45 * i, 1.1)}
        if extra:
            st["ls"] = _DASHES[combos.index(tuple(str(first.at[v, c]) for c in extra)) % len(_DASHES)]
        out[v] = st
    return out


def _share_y(rows: pd.DataFrame, panel_key: str | None, panels: list[Any], log: bool) -> bool:
    """Share the y-axis only when every panel spans at least half the common range (in decades on a log axis)."""
    if panel_key is None or len(panels) < 2:
        return True
    span = []
    for panel in panels:
        v = rows.loc[(rows[panel_key] == panel) & (rows["point"] != "final_norm"), "mean"].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        v = np.log10(np.maximum(v, LOG_FLOOR)) if log else v
        if v.size:
            span.append((v.min(), v.max()))
    if len(span) < 2:
        return True
    lo, hi = min(a for a, _ in span), max(b for _, b in span)
    total = hi - lo
    return total == 0 or all((b - a) >= 0.5 * total for a, b in span)


def _line(ax, rows: pd.DataFrame, label: str, style: dict[str, Any], loglog: bool, spec: dict[str, Any],
          floor: float | None) -> bool:
    """Draw one condition's line; True when a value <= 0 was drawn at the log floor."""
    # the entry after a final norm shares the last block's layer: its own marker
    final = rows[rows["point"] == "final_norm"]
    rows = rows[rows["point"] != "final_norm"]
    if rows.empty:
        return False
    g = rows.groupby("layer")[["mean", "q25", "q75"]].mean().sort_index()
    span = max(g.index.max(), 1) if spec.get("x") == "depth_fraction" else 1
    x = g.index.to_numpy().astype(float) / span
    colour = style["color"]
    if not final.empty:
        ax.plot(final["layer"].to_numpy() / span, final["mean"].to_numpy(), ls="none", marker="x", ms=7, mew=1.6,
                color=colour, label=f"{label} (after final norm)")
    y, lo, hi = g["mean"].to_numpy(), g["q25"].to_numpy(), g["q75"].to_numpy()
    low = np.zeros(len(y), dtype=bool)
    if floor is not None:  # only values <= 0 (exact collapse) move, to the marked floor
        low = y <= 0
        y, lo, hi = (np.where(v <= 0, floor, v) for v in (y, lo, hi))
    if loglog:
        ax.axhline(y[0], color=colour, ls=":", lw=0.8, alpha=0.7)
        keep = x >= 1
        x, y, lo, hi, low = x[keep], y[keep], lo[keep], hi[keep], low[keep]
    ax.plot(x, y, color=colour, ls=style["ls"], lw=style["lw"], label=label, marker=style["marker"], ms=4,
            markevery=0.08, mfc="none", mew=1.1)
    ax.fill_between(x, lo, hi, color=colour, alpha=0.15, lw=0)
    if low.any():
        ax.plot(x[low], y[low], ls="none", marker="v", ms=6, mfc="none", color=colour)
    return bool(low.any())


def draw_profiles(rows: pd.DataFrame, spec: dict[str, Any], *, ax: Any = None):
    """Profiles against the input position: one panel per ``panels`` value (or condition),
    one curve per shown depth (:func:`rankcollapse.masks.influence.shown_depths`)."""
    from ..masks.influence import shown_depths

    rows = rows[rows["point"].str.startswith("position.")]
    rows = rows.assign(_pos=rows["point"].str.slice(len("position.")).astype(np.int64))
    key = spec.get("panels")
    if key == "condition":
        cols = [c for c in CONDITION_COLUMNS if c in rows]
        keys = rows[cols].drop_duplicates()
        label = dict(zip(map(tuple, keys.astype(str).to_numpy()), (condition_of(r) for r in keys.to_dict("records"))))
        rows = rows.assign(_panel=[label[k] for k in map(tuple, rows[cols].astype(str).to_numpy())])
    else:
        rows = rows.assign(_panel=rows[key].astype(str) if key else "")
    panels = list(dict.fromkeys(rows["_panel"]))
    fig, axes = _figure(spec, len(panels), ax, (4.2, 3.2))
    tiny = np.finfo(np.float64).tiny
    for a, panel in zip(axes.flat, panels):
        sub = rows[rows["_panel"] == panel]
        depths = shown_depths(int(sub["layer"].max()))
        for i, h in enumerate(depths):
            line = sub[sub["layer"] == h].sort_values("_pos")
            keep = line["mean"].to_numpy() >= tiny
            a.plot(line["_pos"].to_numpy()[keep], line["mean"].to_numpy()[keep], lw=1.1,
                   color=colour(int(220 * i / max(len(depths) - 1, 1)), "viridis"), label=f"{h}")
        a.set_yscale(spec.get("yscale") or "log")
        a.set_title(_short(panel, rows, key), fontsize=7)
        a.set_xlabel(spec.get("xlabel", "input position j"))
        a.grid(True, which="major", alpha=0.3)
        a.legend(title=spec.get("legend_title", "depth"), fontsize=6, title_fontsize=7, frameon=False, ncol=2)
    for a in axes.flat[len(panels):]:
        a.set_visible(False)
    for a in axes[:, 0]:
        a.set_ylabel(spec.get("ylabel", spec["metric"]))
    fig.suptitle(spec["title"], fontsize=10)
    fig.tight_layout()
    return fig


def _short(panel: str, rows: pd.DataFrame, key: str | None) -> str:
    """A panel title: the condition without the columns every panel shares."""
    if key != "condition":
        return f"{key}: {panel}" if key else panel
    shared = set.intersection(*(set(p.split(" ")) for p in rows["_panel"].unique()))
    return " ".join(b for b in panel.split(" ") if b not in shared) or panel
