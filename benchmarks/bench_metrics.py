"""Cost of the metrics relative to one batched ``torch.linalg.svdvals`` (the floor of
the spectral metrics), measured in one run with interleaved repeats.

Usage: ``.venv/bin/python benchmarks/bench_metrics.py [--shape 256 128 768] [--repeats 3]
[--dtype float32] [--json]``. Target: all metrics <= 2x the svdvals floor, taken in the tall orientation
(svdvals(X^T) when N < d: identical values, much faster on CPU).

``--recorded-metrics``: the metrics ``simulate`` records after every layer (μ, μ/‖X‖_F,
avg|cos|), the layer loop's own call (``runner._metric_fn``; ``max |X|`` is the loop's
and is computed outside the timing) against a minimal torch computation of the same three
numbers, interleaved, best of ``--repeats``, CPU-seconds. Defaults for this case:
(B, N, d) = (64, 128, 384), float64, 1 thread. Target: <= 1.2x minimal torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from rankcollapse.metrics import DEFAULT_METRICS, compute_metrics


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def minimal_recorded(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """μ, μ/‖X‖_F and avg|cos| of ``X`` ``(B, N, d)`` (no zero token) in plain torch."""
    N = X.shape[1]
    mu = torch.linalg.vector_norm(X - X.mean(1, keepdim=True), dim=(1, 2))
    U = X / torch.linalg.vector_norm(X, dim=-1, keepdim=True)
    C = torch.bmm(U, U.mT).abs_()
    abs_cos = (C.sum((1, 2)) - C.diagonal(dim1=1, dim2=2).sum(-1)) / (N * (N - 1))
    return mu, mu / torch.linalg.vector_norm(X, dim=(1, 2)), abs_cos


def recorded_metrics(shape, dtype: torch.dtype, repeats: int) -> dict:
    """The ``--recorded-metrics`` case (module docstring)."""
    from rankcollapse.dynamics.runner import _metric_fn, _peak

    names, measure, _ = _metric_fn(("mu", "mu_relative", "avg_abs_cos"))
    X = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=dtype)
    X += X[:, :1]  # tokens sharing a direction, as after a few layers
    peak = _peak(X)
    cases = {"simulate's call": lambda: measure(X, None, peak), "minimal torch": lambda: minimal_recorded(X)}
    ours, base = cases["simulate's call"](), cases["minimal torch"]()
    rel = {n: float(((ours[n] - b).abs() / b.abs()).max()) for n, b in zip(names, base)}
    load = os.getloadavg()[0]
    times: dict[str, list[float]] = {name: [] for name in cases}
    with torch.no_grad():  # as in simulate's layer loop
        for _ in range(repeats):
            for name, fn in cases.items():
                t0 = time.process_time()
                fn()
                times[name].append(time.process_time() - t0)
    best = {name: min(t) for name, t in times.items()}
    return {"shape": list(shape), "dtype": str(dtype), "threads": torch.get_num_threads(), "repeats": repeats,
            "cpu_seconds": best, "ratio": best["simulate's call"] / best["minimal torch"],
            "max_relative_difference": rel, "load_average_1min": [load, os.getloadavg()[0]]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, default=None, metavar=("B", "N", "D"))
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--dtype", choices=["float32", "float64"], default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--recorded-metrics", action="store_true",
                        help="simulate's per-layer metrics against minimal torch (module docstring)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.recorded_metrics:
        torch.set_num_threads(args.threads or 1)
        result = recorded_metrics(args.shape or (64, 128, 384), getattr(torch, args.dtype or "float64"),
                                  args.repeats or 15)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"X {tuple(result['shape'])} {result['dtype']}, {result['threads']} thread(s), best of "
                  f"{result['repeats']} interleaved, CPU s; 1-min load {result['load_average_1min']}")
            for name, t in result["cpu_seconds"].items():
                print(f"{name:<16} {t:.4f}")
            print(f"ratio {result['ratio']:.2f} (target <= 1.2); largest relative difference "
                  f"{result['max_relative_difference']}")
        return result
    args.shape, args.repeats, args.dtype = args.shape or [256, 128, 768], args.repeats or 5, args.dtype or "float32"
    if args.threads:
        torch.set_num_threads(args.threads)
    X = torch.randn(*args.shape, generator=torch.Generator().manual_seed(0), dtype=getattr(torch, args.dtype))
    # svdvals(X) of the wide (N < d) layout is many times slower on CPU LAPACK than
    # svdvals(X^T) (same values); it is timed once, the rest interleaved.
    wide = _time(lambda: torch.linalg.svdvals(X)) if args.shape[1] < args.shape[2] else None
    cases = {
        "svdvals (floor)": lambda: torch.linalg.svdvals(X.mT if args.shape[1] < args.shape[2] else X),
        "all metrics": lambda: compute_metrics(X, "all"),
        "DEFAULT_METRICS": lambda: compute_metrics(X, DEFAULT_METRICS),
        "avg_abs_cos only": lambda: compute_metrics(X, ("avg_abs_cos",)),
        "mu only": lambda: compute_metrics(X, ("mu",)),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for name, fn in cases.items():  # warm-up
        fn()
    for _ in range(args.repeats):  # interleaved so load changes hit every case alike
        for name, fn in cases.items():
            times[name].append(_time(fn))
    floor = statistics.median(times["svdvals (floor)"])
    rows = {
        name: {"median_s": statistics.median(t), "ratio_to_svdvals": statistics.median(t) / floor}
        for name, t in times.items()
    }
    if wide is not None:
        rows["svdvals(X), wide, once"] = {"median_s": wide, "ratio_to_svdvals": wide / floor}
    result = {"shape": args.shape, "dtype": args.dtype, "threads": torch.get_num_threads(), "cases": rows}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"X {tuple(args.shape)} {args.dtype}, {result['threads']} threads, median of {args.repeats}")
        print(f"{'case':<24} {'seconds':>9} {'x svdvals':>10}")
        for name, r in rows.items():
            print(f"{name:<24} {r['median_s']:>9.3f} {r['ratio_to_svdvals']:>10.2f}")
        status = "meets" if rows["all metrics"]["ratio_to_svdvals"] <= 2.0 else "MISSES"
        print(f"all metrics {status} the 2x target", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
