"""Normalisations as speed regulators, decided on a phase sweep.

Runs three phase grids through the sweep's own path (:func:`rankcollapse.phase.run_phase`:
batched fast path, cache, regime and decay-law columns) and decides the two claims of
:mod:`rankcollapse.phase.normalisation` (speed law, ordering) with their controls:

- main: placement post_ln, pre_ln, peri, mix, lns x norm sphere, layernorm, rmsnorm, dyt x
  qk_norm off, on x qk_scale 0, 0.5, 1, 2 x mask complete, causal x value gaussian,
  orthogonal x shared off, on (1,280 cells);
- ngpt: placement ngpt (norm sphere only), the other axes as above (64 cells);
- zero values: value_scale 0 (W_V = 0), post_ln, pre_ln x sphere, layernorm, rmsnorm x
  qk_scale 0, 1 x complete, causal (24 cells; the negative control of the law rule).

N = 16 tokens, d = 8, depth 128, 16 inputs per cell, seed 0, float64, serial. Writes the
table to ``OUT/normalisation.parquet`` and the summary (settings, timing, claims, controls,
law table) to ``SUMMARY`` (JSON).

Usage: ``python benchmarks/normalisation_phase.py OUT SUMMARY``

``--paper-setting`` runs only the cells of the main grid that match the paper's stated
assumptions (:data:`rankcollapse.phase.normalisation.PAPER_SETTING`: full attention, one
set of weights for all layers), post_ln and pre_ln with a normalising norm (96 cells, the
same cells and seeds as in the full sweep), and writes their speed law, exponent and
controls (the identity-weights control included):
``python benchmarks/normalisation_phase.py --paper-setting OUT SUMMARY``.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import pandas as pd

from rankcollapse._io import write_text_atomic
from rankcollapse.phase.grid import expand_grid
from rankcollapse.phase.normalisation import normalisation_summary
from rankcollapse.phase.sweep import run_phase

FIXED = {"n_tokens": 16, "d_model": 8, "depth": 128}
SAMPLES, SEED = 16, 0
COMMON = {"qk_norm": [False, True], "qk_scale": [0.0, 0.5, 1.0, 2.0], "mask": ["complete", "causal"],
          "value": ["gaussian", "orthogonal"], "shared": [False, True]}
GRIDS = {
    "main": ({"placement": ["post_ln", "pre_ln", "peri", "mix", "lns"], "norm": ["sphere", "layernorm", "rmsnorm", "dyt"],
              **COMMON}, FIXED),
    "ngpt": ({"placement": ["ngpt"], **COMMON}, {**FIXED, "norm": "sphere"}),
    "zero_values": ({"placement": ["post_ln", "pre_ln"], "norm": ["sphere", "layernorm", "rmsnorm"],
                     "qk_scale": [0.0, 1.0], "mask": ["complete", "causal"]}, {**FIXED, "value_scale": 0.0}),
}


PAPER_GRIDS = {"paper_setting": ({"placement": ["post_ln", "pre_ln"], "norm": ["sphere", "layernorm", "rmsnorm"],
                                  "qk_norm": [False, True], "qk_scale": [0.0, 0.5, 1.0, 2.0],
                                  "value": ["gaussian", "orthogonal"]},
                                 {**FIXED, "mask": "complete", "shared": True})}


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(out: Path, summary: Path, grids: dict = GRIDS,
         command: str = "python benchmarks/normalisation_phase.py OUT SUMMARY") -> None:
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    t0, c0 = time.perf_counter(), _cpu_s()
    tables, timings = [], {}
    for name, (axes, fixed) in grids.items():
        table, timing = run_phase(expand_grid(axes, fixed), n_samples=SAMPLES, seed=SEED, cache_dir=out / "cache")
        tables.append(table)
        timings[name] = timing
    table = pd.concat(tables, ignore_index=True)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    out.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out / "normalisation.parquet", index=False)
    doc = {"command": command,
           "settings": {"grids": {k: {"axes": {a: [str(v) for v in vs] for a, vs in ax.items()}, "fixed": fx}
                                  for k, (ax, fx) in grids.items()}, "n_samples": SAMPLES, "seed": SEED},
           "timing": {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_start": load0,
                      "load_end": Path("/proc/loadavg").read_text().split()[:3], "grids": timings},
           **normalisation_summary(table)}
    write_text_atomic(summary, json.dumps(doc, indent=1, default=str, allow_nan=True) + "\n")
    print(json.dumps({"cells": doc["cells"], "timing": doc["timing"], "speed_law": doc["speed_law"]["verdict"],
                      "ordering": doc["ordering"]["verdict"], "controls_pass": doc["controls"]["all_pass"]}))


if __name__ == "__main__":
    args = sys.argv[1:]
    paper = args[:1] == ["--paper-setting"]
    if paper:
        args = args[1:]
    if len(args) != 2:
        sys.exit("usage: python benchmarks/normalisation_phase.py [--paper-setting] OUT SUMMARY")
    if paper:
        main(Path(args[0]), Path(args[1]), PAPER_GRIDS,
             "python benchmarks/normalisation_phase.py --paper-setting OUT SUMMARY")
    else:
        main(Path(args[0]), Path(args[1]))
