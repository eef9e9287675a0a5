"""Influence profiles at long lengths: wall time, CPU seconds and peak memory of
`rankcollapse.masks.influence` (the last query's profile, all depths) at N = 131,072,
H = 12.

Each case runs in a fresh process, so its peak RSS (``ru_maxrss``) is its own; a
baseline process that only imports the package and computes a 2-token profile gives
the fixed cost. The interval masks take the segment-tree path (O(N log N) per layer,
O(N) memory; a causal mask's N^2/2 = 8.6e9 edges are never formed). The last case is
the same causal window written as an intersection (``...&complete``), which has no
intervals and takes the sparse-CSR path (O(E) memory): the ratio of the two window
rows is the gain of the interval path measured in one run. Target (issue 29): under
10 s per case.

Usage: .venv/bin/python benchmarks/bench_influence.py [--n 131072] [--depth 12] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CASES = [
    ("causal", 0.0, 0.0),
    ("causal", 0.5, 0.05),
    ("causal_sliding_window:w=4096", 0.5, 0.0),
    ("sliding_window:w=257", 0.5, 0.0),
    ("schedule:causal_sliding_window:w=4096*5,causal", 0.5, 0.0),
    ("causal_sliding_window:w=256", 0.5, 0.0),
    ("causal_sliding_window:w=256&complete", 0.5, 0.0),
]

_RUNNER = r"""
import json, resource, sys, time
t0, c0 = time.perf_counter(), time.process_time()
from rankcollapse.masks.influence import influence
t1, c1 = time.perf_counter(), time.process_time()
spec, n, depth, alpha, decay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
r = influence(spec, n, depth=depth, alpha=alpha, decay=decay)
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"import_s": t1 - t0, "wall_s": t2 - t1, "cpu_s": c2 - c1, "method": r.method,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "first_token_mass": r.summary["first_token_mass"],
                  "effective_horizon": r.summary["effective_horizon"]}))
"""


def run_case(spec: str, n: int, depth: int, alpha: float, decay: float) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    out = subprocess.run([sys.executable, "-c", _RUNNER, spec, str(n), str(depth), str(alpha), str(decay)],
                         capture_output=True, text=True, check=True, env=env)
    return {"spec": spec, "n": n, "depth": depth, "alpha": alpha, "decay": decay, **json.loads(out.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=131072)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    base = run_case("causal", 2, 1, 0.0, 0.0)
    rows = [run_case(spec, args.n, args.depth, alpha, decay) for spec, alpha, decay in CASES]
    for r in rows:
        r["rss_over_baseline_mib"] = r["peak_rss_mib"] - base["peak_rss_mib"]
    load = {"before": load_before, "after": os.getloadavg()}
    if args.json:
        print(json.dumps({"load_average": load, "baseline": base, "cases": rows}, indent=1))
        return
    print(f"N = {args.n}, H = {args.depth}; load average (1, 5, 15 min) before {load_before[0]:.2f} "
          f"{load_before[1]:.2f} {load_before[2]:.2f}, after {load['after'][0]:.2f} {load['after'][1]:.2f} "
          f"{load['after'][2]:.2f}; baseline process {base['peak_rss_mib']:.0f} MiB")
    print(f"{'spec':48} {'alpha':>5} {'decay':>5} {'method':>9} {'wall s':>7} {'CPU s':>6} {'+MiB':>6} "
          f"{'first mass':>10} {'horizon':>7}")
    for r in rows:
        print(f"{r['spec']:48} {r['alpha']:>5g} {r['decay']:>5g} {r['method']:>9} {r['wall_s']:>7.2f} "
              f"{r['cpu_s']:>6.2f} {r['rss_over_baseline_mib']:>6.0f} {r['first_token_mass']:>10.3g} "
              f"{r['effective_horizon']:>7}")


if __name__ == "__main__":
    main()
