"""Temperature against sequence length: the γ of the collapse switch at each N.

Cells (docs/phase.md, "Temperature against sequence length"): the model of Chen, Lin,
Polyanskiy & Rigollet (ICLR 2026) in the phase sweep: ``beta=log:γ`` (scores
``γ log N <x_i, x_j>``), ``input=simplex`` (pairwise cosines ρ = 1/2, so the paper's
``γ_c = 2``), ``norm=sphere``, ``placement=none`` (tokens stay on the sphere: the attention of
every layer sees unit tokens), ``value=orthogonal`` (a rotation, under which every measure
equals that of ``W_V = I``), complete mask, d = 64, depth 1. Each (N, γ) cell is its own
:func:`rankcollapse.phase.run_phase` call (one batch), so that the dense path's ``(B, N, N)``
weights at N = 4,096 hold a single cell's samples.

Per cell ``r = m(1) / m(0)`` with ``m = μ/||X||_F`` (geometric means over the cell's inputs);
:func:`rankcollapse.theory.critical.switch` gives the γ where ``r`` crosses 1/2 and the
10-90% width. Writes ``OUT/cells.csv``, ``OUT/switch.csv``, ``OUT/timing.json``, ``OUT/crossings.json`` (where the curves of consecutive N cross) and
the figure ``FIG``.

Usage: ``PYTHONPATH=src OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/temperature_length.py
OUT FIG [--cache DIR] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

RHO = 0.5  # the simplex input's default
D_MODEL = 64
FIXED = {"d_model": D_MODEL, "depth": 1, "norm": "sphere", "input": "simplex", "value": "orthogonal"}
SMALL = [0.5 + 0.25 * i for i in range(15)]  # 0.5 .. 4.0
#: N -> (γ grid, inputs per cell): fewer points and inputs where a layer costs N^2 (at
#: N = 65,536 a cell took ~2 CPU-minutes on the shared machine: the points bracketing the switch)
PLAN = {256: (SMALL, 4), 1024: (SMALL, 4), 4096: (SMALL, 4),
        16384: ([0.75 + 0.25 * i for i in range(12)], 2),
        65536: ([1.75, 2.0, 2.25], 1)}


def start_ratio(n_tokens: int, samples: int) -> float:
    """``m(0)``: geometric mean over the cell's inputs of ``μ/||X(0)||_F`` (seed 0, as run_phase)."""
    from rankcollapse.metrics import mu_relative
    from rankcollapse.phase.cell import make_input

    m0 = mu_relative(make_input("simplex", samples, n_tokens, D_MODEL, 0)).numpy()
    return float(np.exp(np.log(m0).mean()))


def run(out: Path, cache: Path, plan: dict) -> tuple[pd.DataFrame, dict]:
    from rankcollapse.phase import expand_grid, run_phase

    rows, timing = [], {}
    for n, (gammas, samples) in plan.items():
        w0, c0, cached = time.perf_counter(), time.process_time(), 0
        for g in gammas:
            cells = expand_grid({"beta": [f"log:{g}"]}, {**FIXED, "n_tokens": n})
            table, t = run_phase(cells, n_samples=samples, cache_dir=cache)
            rows.append(table.iloc[0].to_dict())
            cached += t["cached"]
        m0 = start_ratio(n, samples)
        for r in rows[-len(gammas):]:
            r["m0"] = m0
        timing[n] = {"wall_s": round(time.perf_counter() - w0, 1), "cpu_s": round(time.process_time() - c0, 1),
                     "cells": len(gammas), "samples": samples, "cells_from_cache": cached}
        print(n, timing[n], flush=True)
    cells = pd.DataFrame(rows)
    cells["gamma"] = cells["beta"].map(lambda v: float(v.split(":")[1]))
    cells["ratio"] = cells["mu_relative"] / cells["m0"]
    return cells, timing


def summarise(cells: pd.DataFrame) -> pd.DataFrame:
    from rankcollapse.theory.critical import annealed_gamma, paper_gamma, switch

    out = []
    for n, g in cells.groupby("n_tokens"):
        s = switch(g["gamma"], g["ratio"])
        out.append({"n_tokens": int(n), "log_n": round(math.log(n), 3), "samples": int(g["n_trajectories"].iloc[0]),
                     "gamma_paper": paper_gamma(RHO), "gamma_annealed": round(annealed_gamma(n, D_MODEL, RHO), 3),
                     **{k: round(v, 3) for k, v in s.items()}})
    return pd.DataFrame(out)


def crossings(cells: pd.DataFrame) -> list[dict]:
    """Where the curves r(γ) of consecutive N cross (``r_N2 - r_N1`` changes sign from + to -
    on their common γ points, linearly interpolated): a finite-size estimate of the critical γ
    (below it r falls with N, above it r rises). Descriptive: added after the run."""
    from rankcollapse.theory.critical import _crossing

    out, groups = [], [(n, g.set_index("gamma")["ratio"]) for n, g in cells.groupby("n_tokens")]
    for (n1, r1), (n2, r2) in zip(groups, groups[1:]):
        common = r1.index.intersection(r2.index).sort_values()
        diff = (r1[common] - r2[common]).to_numpy()  # > 0 below the crossing, < 0 above
        out.append({"n_tokens": [int(n1), int(n2)], "gamma_cross": round(_crossing(common.to_numpy(), -diff, 0.0), 3),
                    "points": len(common)})
    return out


def figure(cells: pd.DataFrame, summary: pd.DataFrame, path: Path) -> None:
    from rankcollapse._figure import colour, new_axes, save_figure
    from rankcollapse.theory.critical import SWITCH_LEVEL, WIDTH_LEVELS, paper_gamma

    fig, ax = new_axes(figsize=(7.0, 4.2))
    for i, (n, g) in enumerate(cells.groupby("n_tokens")):
        g = g.sort_values("gamma")
        ax.plot(g["gamma"], g["ratio"], "o-", ms=3, color=colour(i), label=f"N = 2^{int(round(math.log2(n)))}")
        ann = summary.loc[summary["n_tokens"] == n, "gamma_annealed"].iloc[0]
        ax.axvline(ann, color=colour(i), ls=":", lw=0.8)
    ax.axvline(paper_gamma(RHO), color="k", lw=1.2, label="paper: γ_c = 1/(1-ρ) = 2")
    for level in (SWITCH_LEVEL, *WIDTH_LEVELS):
        ax.axhline(level, color="0.6", lw=0.6, ls="--")
    ax.set_xlabel("γ   (attention scale β = γ log N)")
    ax.set_ylabel("m(1) / m(0),   m = μ / ||X||_F")
    ax.set_title(f"One SA-LN layer, almost-simplex start (ρ = {RHO}), d = {D_MODEL}\n"
                 "dotted: finite-d estimate of γ_c per N (same colour)", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    save_figure(fig, path)


def main() -> None:
    from rankcollapse._io import write_json_atomic, write_text_atomic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("fig", type=Path)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="N = 256 and 1,024 only (a check of the script)")
    a = ap.parse_args()
    plan = {n: PLAN[n] for n in (256, 1024)} if a.quick else PLAN
    a.out.mkdir(parents=True, exist_ok=True)
    cells, timing = run(a.out, a.cache or a.out / "cache", plan)
    summary = summarise(cells)
    keep = ["n_tokens", "gamma", "n_trajectories", "mu_relative", "m0", "ratio", "attention_entropy", "regime"]
    write_text_atomic(a.out / "cells.csv", cells[keep].to_csv(index=False, float_format="%.6g"))
    write_text_atomic(a.out / "switch.csv", summary.to_csv(index=False))
    write_json_atomic(a.out / "timing.json", {str(k): v for k, v in timing.items()})
    write_json_atomic(a.out / "crossings.json", crossings(cells))
    figure(cells, summary, a.fig)
    print(summary.to_string(index=False))
    print(crossings(cells))


if __name__ == "__main__":
    main()
