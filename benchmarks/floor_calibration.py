"""Calibrate the round-off floor of ``mu/||X||_F`` (:mod:`rankcollapse.metrics.floor`).

An exactly collapsed start ``X0 = 1 x^T`` (every token the same row) stays collapsed in
exact arithmetic under every block the package simulates: whatever the computed
``mu/||X||_F`` reads is round-off of the network code. This script runs the simulator
(float64) from such starts over a grid of N, d, masks and variants, and prints per (N, d)
the largest ``mu/||X||_F`` over all layers, masks, variants and seeds, in units of
machine epsilon, next to the model's floor :func:`~rankcollapse.metrics.floor.mu_floor`
``2 (N + d) eps`` and the ratio of the two (the model's margin).

    PYTHONPATH=src python benchmarks/floor_calibration.py [--depth 64]

It also runs random starts under the complete mask until they collapse and reports
where their ``mu/||X||_F`` levels off (the values a collapsed trajectory reads).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.metrics.floor import EPS64, mu_floor

VARIANTS = ("pure", "sphere", "layernorm", "skip", "post_ln")
MASKS = ("complete", "causal", "sliding_window:w=9")


def collapsed_start(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(d, generator=g, dtype=torch.float64)
    return x.expand(2, n, d).clone() * torch.tensor([1.0, 3.0], dtype=torch.float64)[:, None, None]


def worst(X0: torch.Tensor, depth: int) -> float:
    out = 0.0
    for mask in MASKS:
        for variant in VARIANTS:
            for seed in (0, 1):
                r = simulate(X0, mask=mask, metrics=("mu_relative",), block=variant,
                             run=RunConfig(depth=depth, seed=seed, dtype=torch.float64))
                m = r.metrics["mu_relative"].numpy()
                m = m[np.isfinite(m)]
                out = max(out, float(m.max()) if m.size else 0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=64)
    args = ap.parse_args()
    print(f"exactly collapsed starts X0 = 1 x^T, float64, depth {args.depth}, masks {MASKS}, variants {VARIANTS}")
    print(f"{'N':>5} {'d':>4} {'max m/eps':>10} {'model/eps':>10} {'margin':>8}")
    for n in (16, 32, 128, 512):
        for d in (16, 64, 384):
            w = worst(collapsed_start(n, d, n + d), args.depth)
            model = mu_floor(n, d)
            print(f"{n:>5} {d:>4} {w / EPS64:>10.2f} {model / EPS64:>10.0f} {model / max(w, 1e-300):>8.1f}")
    print("random starts under the complete mask (pure SA, depth 4 x --depth): where m levels off")
    for n, d in ((32, 16), (128, 384)):
        X0 = torch.randn(4, n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        r = simulate(X0, mask="complete", metrics=("mu_relative",),
                     run=RunConfig(depth=4 * args.depth, seed=0, dtype=torch.float64))
        m = r.metrics["mu_relative"].numpy()[-args.depth:]
        print(f"N {n} d {d}: last {args.depth} layers m/eps in [{m.min() / EPS64:.2f}, {m.max() / EPS64:.2f}], "
              f"model {mu_floor(n, d) / EPS64:.0f}")


if __name__ == "__main__":
    main()
