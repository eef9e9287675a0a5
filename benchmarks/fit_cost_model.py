"""Fit the constants of the cost model (``rankcollapse.experiments.cost.CONSTANTS``) to
the CPU-seconds recorded in finished runs, and print them with each run's predicted
and recorded cost.

Each run's units are planned again from its ``config.json`` (its configs, scale, seed,
data and overrides; nearby settings included) and matched to its ``timings`` by key,
else by label; per cost class (and per kind, the fallback of its classes) the
non-negative least-squares fit of ``compute_cpu_seconds = a + b * work`` gives
``(a, b)``. Paste the printed dict into ``experiments/cost.py``.

    .venv/bin/python benchmarks/fit_cost_model.py docs/results/*/config.json [--check]

``--check`` fits nothing: it prints predicted against recorded cost per run with the
constants in the package.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from scipy.optimize import nnls  # noqa: E402

from rankcollapse.experiments import cost  # noqa: E402
from rankcollapse.experiments.runner import recorded_units  # noqa: E402


def fit(points: dict[str, list[tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    """``{class: (a, b)}``: per class, non-negative least squares of seconds on
    ``[1, work]``; a class whose units all do the same work gets ``(mean, 0)``, and one
    without work (a theory check) its mean."""
    out = {}
    for cls, pts in sorted(points.items()):
        w = np.array([p[0] for p in pts])
        s = np.array([p[1] for p in pts])
        if np.ptp(w) == 0:
            out[cls] = (float(s.mean()), 0.0) if w[0] == 0 else (0.0, float(s.mean() / w[0]))
            continue
        scale = w.max()
        (a, b), _ = nnls(np.stack([np.ones_like(w), w / scale], axis=1), s)
        out[cls] = (float(a), float(b / scale))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+", type=Path)
    ap.add_argument("--check", action="store_true", help="Compare the package's constants with the runs; fit nothing.")
    args = ap.parse_args()
    runs, points = [], defaultdict(list)
    for path in args.configs:
        config = json.loads(path.read_text())
        if not config.get("timings"):
            continue
        pairs, n_tokens = recorded_units(config)
        runs.append((path, pairs, n_tokens))
        for unit, seconds in pairs:
            work = cost.unit_work(unit, n_tokens)
            points[cost.unit_class(unit)].append((work, seconds))
            points[unit.kind].append((work, seconds))
    constants = cost.CONSTANTS if args.check else fit(points)
    for path, pairs, n_tokens in runs:
        pred = sum(cost.unit_cost(u, n_tokens, constants) or 0.0 for u, _ in pairs)
        rec = sum(s for _, s in pairs)
        print(f"{path.parent.name}: {len(pairs)} units, predicted {pred:,.0f} CPU-s, recorded {rec:,.0f} "
              f"(ratio {pred / rec:.2f})")
    if not args.check:
        print("CONSTANTS = {")
        for cls, (a, b) in constants.items():
            print(f"    {cls!r}: ({a:.4g}, {b:.4g}),")
        print("}")


if __name__ == "__main__":
    main()
