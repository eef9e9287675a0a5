"""Mask analysis at long lengths: time and peak memory of `mask describe` at N = 65,536.

Each case runs in a fresh process (`python -c ... main()` of the real CLI with
`--json`), so its peak RSS (``ru_maxrss``) is its own. A baseline process that only
imports the package and parses `causal` at N = 2 gives the fixed cost (Python, torch,
scipy); the difference is what the analysis itself needs. An N x N boolean matrix
would need N^2 bytes (4 GiB at N = 65,536).

Usage: .venv/bin/python benchmarks/bench_masks.py [--n 65536] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = [
    "causal_sliding_window:w=256",
    "sliding_window:w=257",
    "longformer:w=257,globals=0",
    "strided:stride=256",
    "causal&sliding_window:w=513",
]

_RUNNER = r"""
import io, json, resource, sys, time, contextlib
t0 = time.perf_counter()
from rankcollapse.cli import main
t1 = time.perf_counter()
sys.argv = ["rankcollapse", "mask", "describe", sys.argv[1], "--n-tokens", sys.argv[2], "--format", "json"]
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    try:
        main()
    except SystemExit as e:
        if e.code:
            raise
t2 = time.perf_counter()
d = json.loads(buf.getvalue())
print(json.dumps({"import_s": t1 - t0, "describe_s": t2 - t1,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "radius": d["radius"], "diameter": d["diameter"], "n_edges": d["n_edges"],
                  "n_centers": len(d["centers"]), "n_bfs": d["n_bfs"],
                  "closed_form_agrees": d["closed_form_agrees"]}))
"""


def run_case(spec: str, n: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _RUNNER, spec, str(n)], capture_output=True,
                         text=True, check=True)
    return {"spec": spec, "n": n, **json.loads(out.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=65536)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = run_case("causal", 2)
    rows = [run_case(spec, args.n) for spec in CASES]
    dense_mib = args.n**2 / 2**20
    for r in rows:
        r["rss_over_baseline_mib"] = r["peak_rss_mib"] - base["peak_rss_mib"]
        r["dense_mask_mib"] = dense_mib
    if args.json:
        print(json.dumps({"baseline": base, "cases": rows}, indent=1))
        return
    print(f"N = {args.n}; an N x N bool matrix would take {dense_mib:,.0f} MiB; "
          f"baseline process (import + tiny mask): {base['peak_rss_mib']:.0f} MiB")
    head = f"{'spec':32} {'edges':>11} {'centers':>7} {'radius':>6} {'diam':>5} {'BFS':>4} " \
           f"{'describe s':>10} {'peak MiB':>8} {'+ over base':>11} {'closed form':>11}"
    print(head)
    for r in rows:
        print(f"{r['spec']:32} {r['n_edges']:>11,} {r['n_centers']:>7} {r['radius']!s:>6} "
              f"{r['diameter']!s:>5} {r['n_bfs']:>4} {r['describe_s']:>10.2f} {r['peak_rss_mib']:>8.0f} "
              f"{r['rss_over_baseline_mib']:>11.0f} {r['closed_form_agrees']!s:>11}")


if __name__ == "__main__":
    main()
