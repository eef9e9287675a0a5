"""Cost of the metrics relative to one batched ``torch.linalg.svdvals`` (the floor of
the spectral metrics), measured in one run with interleaved repeats.

Usage: ``.venv/bin/python benchmarks/bench_metrics.py [--shape 256 128 768] [--repeats 3]
[--dtype float32] [--json]``. Target: all metrics <= 2x the svdvals floor, taken in the tall orientation
(svdvals(X^T) when N < d: identical values, much faster on CPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from rankcollapse.metrics import DEFAULT_METRICS, compute_metrics


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, default=[256, 128, 768], metavar=("B", "N", "D"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
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
