"""Summaries of a phase table, the numbers docs/phase.md reports (the normalisation
claims: :mod:`.normalisation`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .._figure import new_axes, new_figure, save_figure
from .grid import AXES
from .normalisation import NO_PAIRS, bounded_median, cell_floor
from .regime import REGIMES
from .report import COLOURS, theory_agreement


def paired_norm_effect(table: pd.DataFrame, norm: str, base: str = "none") -> pd.DataFrame:
    """Cells with ``norm`` joined to the same cell with ``base``: ``regime_base``, ``regime``,
    ``dlog10_mu`` (log10 mu_relative, norm minus base) and the axis values."""
    axes = [a for a in AXES if a in table and a != "norm"]
    left = table[table["norm"] == base].set_index(axes)
    right = table[table["norm"] == norm].set_index(axes)
    joined = right[["regime", "mu_relative"]].join(left[["regime", "mu_relative"]], rsuffix="_base", how="inner")
    joined["dlog10_mu"] = (np.log10(joined["mu_relative"].clip(lower=1e-300))
                           - np.log10(joined["mu_relative_base"].clip(lower=1e-300)))
    return joined.reset_index()


def helps(pairs: pd.DataFrame) -> pd.Series:
    """Pairs where the base collapses (or diverges) and the normalised cell does not."""
    bad = pairs["regime_base"].isin(["rank_collapse", "diverging"])
    return bad & ~pairs["regime"].isin(["rank_collapse", "diverging"])


def theory_summary(table: pd.DataFrame) -> dict[str, Any]:
    """The theory's agreement (:func:`.report.theory_agreement`) and the labels of the
    Theorem-1 cells (``theorem1_consistent``)."""
    out = theory_agreement(table)
    t1 = table[table["theory_source"] == "theorem1"]
    if len(t1):  # Theorem 1 is asymptotic: a cell whose mu still falls at the last layer is on its way
        out["theorem1_consistent"] = {
            "n": int(len(t1)), "rank_collapse": int((t1["regime"] == "rank_collapse").sum()),
            "collapsing_slowly": int((t1["regime"] == "collapsing_slowly").sum()),
            "other": t1.loc[~t1["regime"].isin(["rank_collapse", "collapsing_slowly"]), "regime"].value_counts().to_dict()}
    return out


def summarize(table: pd.DataFrame) -> dict[str, Any]:
    """The numbers docs/phase.md reports (JSON-able)."""
    out: dict[str, Any] = {"cells": int(len(table)), "regimes": table["regime"].value_counts().to_dict()}
    out["norm_effect"] = {}
    for norm in ("sphere", "layernorm", "rmsnorm"):
        if norm not in set(table["norm"]) or "none" not in set(table["norm"]):
            continue
        p = paired_norm_effect(table, norm)
        h = helps(p)
        by = p.assign(helps=h).groupby(["alpha", "placement"])["helps"].mean().round(4)
        c = p[p["regime_base"] == "rank_collapse"]  # the pairs whose base collapses
        out["norm_effect"][norm] = {
            "pairs": int(len(p)), "helps": int(h.sum()), "hurts": int((~p["regime_base"].isin(["rank_collapse", "diverging"])
                                                                     & p["regime"].isin(["rank_collapse"])).sum()),
            **bounded_median(p["mu_relative"], p["mu_relative_base"], cell_floor(p)),
            "median_dlog10_mu_where_base_collapses": bounded_median(c["mu_relative"], c["mu_relative_base"],
                                                                    cell_floor(c)) if len(c) else dict(NO_PAIRS),
            "helps_by_alpha_placement": {f"alpha={k[0]:g},{k[1]}": v for k, v in by.items()},
            "regime_pairs": {f"{a} -> {b}": int(n) for (a, b), n in p.groupby(["regime_base", "regime"]).size().items()},
        }
    out["trajectory_fractions"] = trajectory_fractions(table)
    if "shared" in table:
        out["by_shared"] = {("on" if k else "off"): {"cells": int(len(g)), "regimes": g["regime"].value_counts().to_dict(),
                                                    "trajectory_fractions": trajectory_fractions(g)}
                            for k, g in table.groupby("shared")}
    out["stable_states"] = stable_states(table)
    att = table[table["regime"].isin(["uniform_attention", "one_hot_attention"])]
    out["attention_labels"] = {"cells": int(len(att)),
                               "whole_depth_rate_interval_below_0": int((att["rate_hi"] < 0).sum()),
                               "tail_rate_interval_below_0": int((att["rate_last_hi"] < 0).sum())}
    rc = table.assign(collapse=table["regime"] == "rank_collapse")
    if "mask" in table:
        out["by_mask"] = {m: {"radius": int(g["radius"].iloc[0]), "cells": int(len(g)),
                              "regimes": g["regime"].value_counts().to_dict(),
                              "frac_rank_collapse": round(float(g["collapse"].mean()), 4),
                              "median_rate_collapsing": float(g.loc[g["collapse"], "rate"].median())}
                          for m, g in rc.groupby("mask")}
    if "d_qk" in table:
        out["by_d_qk"] = {int(k): {"frac_rank_collapse": round(float(g["collapse"].mean()), 4),
                                   "median_entropy": float(g["attention_entropy"].median())}
                          for k, g in rc.groupby("d_qk")}
    regimes = sorted(set(table["regime"]))
    out["by_qk_scale"] = {float(k): {r: round(float((g["regime"] == r).mean()), 4) for r in regimes}
                          for k, g in rc.groupby("qk_scale")}
    if "beta" in table and table["beta"].notna().any():  # the cells that set beta have no qk_scale
        out["by_beta"] = {(k if isinstance(k, str) else float(k)): {r: round(float((g["regime"] == r).mean()), 4)
                                                                     for r in regimes} for k, g in rc.groupby("beta")}
    out["theory"] = {**theory_summary(table), "theorem1_envelope": envelope_summary(table)}
    if "law" in table:  # a table without the decay-law columns has none
        out["decay_law"] = {p: g["law"].value_counts().to_dict() for p, g in table.groupby("placement")}
    return out


def trajectory_fractions(table: pd.DataFrame) -> dict[str, float]:
    """Fraction of all trajectories of ``table`` in each regime."""
    n = table["n_trajectories"].sum()
    return {r: round(float((table[f"frac_{r}"] * table["n_trajectories"]).sum() / n), 5) for r in REGIMES
            if f"frac_{r}" in table} if n else {}


def stable_states(table: pd.DataFrame) -> dict[str, Any]:
    """Cells with a trajectory at a stable state: counts, fractions, majority labels, by axis."""
    st = table[table["frac_stable_rank_k"] > 0]
    major = table[(table["regime"] == "stable_rank_k") & (table["k"] > 1)]
    out: dict[str, Any] = {"cells_with_any": int(len(st)), "majority_stable_rank_gt1": int(len(major)),
                           "max_fraction": float(st["frac_stable_rank_k"].max()) if len(st) else 0.0,
                           "majority_labels": st["regime"].value_counts().to_dict()}
    for axis in ("shared", "norm", "alpha", "placement", "mask", "value"):
        if axis in table and len(st):
            out[f"by_{axis}"] = {str(k): int(v) for k, v in st[axis].value_counts().items()}
    return out


def envelope_summary(table: pd.DataFrame) -> dict[str, Any]:
    """Theorem 1's pointwise envelope over the ``theorem1`` cells and, as the negative control,
    the pure-SA cells outside A2."""
    out: dict[str, Any] = {}
    if "envelope_points" not in table:
        return out
    for name, sub in (("theorem1", table[table["theory_source"] == "theorem1"]),
                      ("pure_sa_outside_A2", table[table["theory_source"] == "pure_sa_outside_A2"])):
        sub = sub[sub["envelope_points"] > 0]
        out[name] = {"cells": int(len(sub)), "points": int(sub["envelope_points"].sum()),
                     "violations": int(sub["envelope_violations"].sum()),
                     "cells_with_violations": int((sub["envelope_violations"] > 0).sum()),
                     "max_log10_margin": float(sub["envelope_log10_margin"].max()) if len(sub) else float("nan"),
                     "median_log10_margin": float(sub["envelope_log10_margin"].median()) if len(sub) else float("nan")}
    return out


def boundary_figure(table: pd.DataFrame, by: str, path: Path | None, title: str, *, ax: Any = None) -> Any:
    """Fraction of ``rank_collapse`` cells against ``qk_scale``, one line per value of ``by``, on
    ``ax`` (else a new figure); written to ``path`` unless None; returns the figure."""
    fig, ax = new_axes(ax, figsize=(4.2, 3.0))
    for key, g in table.groupby(by):
        f = g.groupby("qk_scale")["regime"].apply(lambda r: (r == "rank_collapse").mean())
        label = f"{by}={key}" + (f" (r={int(g['radius'].iloc[0])})" if by == "mask" else "")
        ax.plot(f.index, f.values, marker="o", label=label)
    ax.set(xscale="log", xlabel="query/key scale s", ylabel="fraction rank_collapse", ylim=(-0.02, 1.02))
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=6)
    if path is not None:
        fig.tight_layout()
        save_figure(fig, path, dpi=80)
    return fig


def regime_figure(table: pd.DataFrame, path: Path | None, rows: tuple[str, ...] = ("norm", "alpha", "placement")) -> Any:
    """Stacked regime fractions per ``qk_scale``, one panel per combination of ``rows``; written
    to ``path`` unless None; returns the figure."""
    groups = list(table.groupby(list(rows)))
    ncol = 4
    nrow = math.ceil(len(groups) / ncol)
    fig = new_figure((2.4 * ncol, 1.9 * nrow + 0.4))
    axs = fig.subplots(nrow, ncol, squeeze=False, sharey=True)
    for ax in axs.flat[len(groups):]:
        ax.axis("off")
    for ax, (key, g) in zip(axs.flat, groups):
        frac = pd.crosstab(g["qk_scale"], g["regime"], normalize="index").reindex(columns=list(REGIMES), fill_value=0)
        bottom = np.zeros(len(frac))
        xs = np.arange(len(frac))
        for r in REGIMES:
            ax.bar(xs, frac[r].values, bottom=bottom, color=COLOURS[r], width=0.85)
            bottom += frac[r].values
        ax.set_xticks(xs, [f"{v:g}" for v in frac.index], fontsize=5)
        ax.tick_params(labelsize=5)
        ax.set_title(", ".join(f"{n}={v}" for n, v in zip(rows, key if isinstance(key, tuple) else (key,))), fontsize=6)
    fig.supxlabel("query/key scale s", fontsize=7)
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(color=COLOURS[r], label=r) for r in REGIMES], loc="lower center", ncol=4, fontsize=6)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    if path is not None:
        save_figure(fig, path, dpi=80)
    return fig
