"""Influence profiles at long lengths (N = 131,072, H = 12): the project against the O(N)
anchors and the segment tree, side by side in one process; then every case in a fresh process.

Side by side (interleaved repeats, numpy on one thread, CPU seconds from
``time.process_time``, the median and the best of ``--repeats``; peak memory from
``tracemalloc`` in a separate untimed run; the load average before and after):

* ``project``: ``rankcollapse.masks.influence`` as called (parse, plan, H products, the
  per-depth summaries); ``products``: the same without the summaries (the operator and
  its H products, what the anchors compute).
* ``anchor``: the shortest O(N) numpy loop for the case: reverse cumulative sums for
  ``causal`` (``C^H``'s last row); for ``sliding_window:w=257`` block prefix/suffix sums
  (van Herk / Gil-Werman: blocks of the window's width, each window is one block's suffix
  plus the next block's prefix).
* ``tree``: the previous interval path, a segment tree of range sums (O(N log N) per
  layer), kept here only for this comparison.

``max rel diff`` is the largest relative difference of each profile from the anchor's
over entries >= float64's smallest normal number (the anchors add in sequence over up to N
terms, so their own error is ~N eps at worst).

Fresh processes: each case runs in its own process, so its peak RSS (``ru_maxrss``) is its
own; a baseline process that only imports the package and computes a 2-token profile gives
the fixed cost. The interval masks take the O(N)-per-layer block-scan path (a causal
mask's N^2/2 = 8.6e9 edges are never formed); the last case is the same causal window
written as an intersection (``...&complete``), which has no intervals and takes the
sparse-CSR path (O(E) memory).

Usage: .venv/bin/python benchmarks/bench_influence.py [--n 131072] [--depth 12] [--repeats 9] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc

import numpy as np

CASES = [
    ("causal", 0.0, 0.0),
    ("causal", 0.5, 0.05),
    ("causal_sliding_window:w=4096", 0.5, 0.0),
    ("sliding_window:w=257", 0.5, 0.0),
    ("schedule:causal_sliding_window:w=4096*5,causal", 0.5, 0.0),
    ("causal_sliding_window:w=256", 0.5, 0.0),
    ("causal_sliding_window:w=256&complete", 0.5, 0.0),
]
SIDE_BY_SIDE = [("causal", 0.0), ("sliding_window:w=257", 0.5)]

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


# ------------------------------------------------------------- the methods compared
def project(spec: str, n: int, depth: int, alpha: float) -> np.ndarray:
    from rankcollapse.masks.influence import influence

    return influence(spec, n, depth=depth, alpha=alpha).profiles


def products(spec: str, n: int, depth: int, alpha: float) -> np.ndarray:
    from rankcollapse.masks import parse_mask
    from rankcollapse.masks.influence import _operator, _profiles

    op = _operator(parse_mask(spec, n), 0.0)
    return _profiles([op] * depth, n, [alpha] * depth, periodic=True)


def anchor(spec: str, n: int, depth: int, alpha: float) -> np.ndarray:
    """The O(N) numpy loop for ``causal`` or ``sliding_window:w=W`` (odd W), no decay."""
    out, v = np.empty((depth, n)), np.zeros(n)
    v[-1] = 1.0
    if spec == "causal":
        z = np.arange(1.0, n + 1.0)
        for h in range(depth):
            s = np.cumsum((v / z)[::-1])[::-1]
            v = s if alpha == 0.0 else alpha * v + (1.0 - alpha) * s
            out[h] = v
        return out
    w = int(spec.split("w=")[1])
    half = w // 2  # key j is attended by the queries j - half .. j + half
    j = np.arange(n)
    z = (np.minimum(n - 1, j + half) - np.maximum(0, j - half) + 1).astype(np.float64)
    blocks = -(-(n + 2 * half) // w)
    padded = np.zeros(blocks * w)
    for h in range(depth):
        padded[half:half + n] = v / z
        x = padded.reshape(blocks, w)
        suffix = np.cumsum(x[:, ::-1], axis=1)[:, ::-1].ravel()
        prefix = np.cumsum(x, axis=1).ravel()
        tail = prefix[2 * half:2 * half + n].copy()
        tail[::w] = 0.0  # a window starting a block is that block's suffix alone
        s = suffix[:n] + tail
        v = alpha * v + (1.0 - alpha) * s
        out[h] = v
    return out


def tree(spec: str, n: int, depth: int, alpha: float) -> np.ndarray:
    """The segment-tree interval path (no decay): ``v -> v Â`` from two range sums per key."""
    from rankcollapse.masks import interval_graph, parse_mask

    lo, hi = parse_mask(spec, n).intervals
    keys = np.arange(n)
    z = (hi - lo + 1).astype(np.float64)
    lo_rev, hi_rev = interval_graph.reverse(lo, hi)
    has = lo_rev < keys
    out, v = np.empty((depth, n)), np.zeros(n)
    v[-1] = 1.0
    for h in range(depth):
        u = v / z
        s = _tree_range_sums(u, keys, hi_rev)
        if has.any():
            s[has] += _tree_range_sums(u[::-1].copy(), (n - keys)[has], (n - 1 - lo_rev)[has])
        v = s if alpha == 0.0 else alpha * v + (1.0 - alpha) * s
        out[h] = v
    return out


def _tree_range_sums(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[k] = sum_{i=a[k]}^{b[k]} x[i]`` on a bottom-up segment tree, O((N + K) log N)."""
    n = x.shape[0]
    size = 1 << max(1, (n - 1).bit_length())
    levels = size.bit_length() - 1
    nodes = [np.zeros(size)]
    nodes[0][:n] = x
    for k in range(levels):
        nodes.append(nodes[k].reshape(-1, 2).sum(1))
    out = np.zeros(a.shape[0])
    lo, hi = np.asarray(a, dtype=np.int64).copy(), np.asarray(b, dtype=np.int64) + 1
    for k in range(levels + 1):
        live = lo < hi
        if not live.any():
            break
        take = live & (lo & 1).astype(bool)
        if take.any():
            out[take] += nodes[k][lo[take]]
            lo[take] += 1
        take = (lo < hi) & (hi & 1).astype(bool)
        if take.any():
            hi[take] -= 1
            out[take] += nodes[k][hi[take]]
        lo >>= 1
        hi >>= 1
    return out


METHODS = {"project": project, "products": products, "anchor": anchor, "tree": tree}


def side_by_side(spec: str, alpha: float, n: int, depth: int, repeats: int) -> dict:
    cpu: dict[str, list[float]] = {name: [] for name in METHODS}
    result: dict[str, np.ndarray] = {}
    for _ in range(repeats):  # interleaved
        for name, fn in METHODS.items():
            c0 = time.process_time()
            result[name] = fn(spec, n, depth, alpha)
            cpu[name].append(time.process_time() - c0)
    peak = {}
    for name, fn in METHODS.items():
        tracemalloc.start()
        fn(spec, n, depth, alpha)
        peak[name] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    ref = result["anchor"]
    keep = ref >= np.finfo(np.float64).tiny
    row = {"spec": spec, "alpha": alpha, "n": n, "depth": depth, "repeats": repeats}
    for name in METHODS:
        diff = float(np.max(np.abs(result[name][keep] - ref[keep]) / ref[keep]))
        med, best = statistics.median(cpu[name]), min(cpu[name])
        row[name] = {"cpu_s": med, "cpu_s_best": best, "cpu_s_all": cpu[name], "peak_mib": peak[name],
                     "max_rel_diff": diff, "ratio_to_anchor": med / statistics.median(cpu["anchor"]),
                     "best_ratio_to_anchor": best / min(cpu["anchor"])}
    return row


def run_case(spec: str, n: int, depth: int, alpha: float, decay: float) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    out = subprocess.run([sys.executable, "-c", _RUNNER, spec, str(n), str(depth), str(alpha), str(decay)],
                         capture_output=True, text=True, check=True, env=env)
    return {"spec": spec, "n": n, "depth": depth, "alpha": alpha, "decay": decay, **json.loads(out.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=131072)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    project("causal", 64, 2, 0.0)  # imports and first calls outside the timings
    pairs = [side_by_side(spec, alpha, args.n, args.depth, args.repeats) for spec, alpha in SIDE_BY_SIDE]
    load_mid = os.getloadavg()
    base = run_case("causal", 2, 1, 0.0, 0.0)
    rows = [run_case(spec, args.n, args.depth, alpha, decay) for spec, alpha, decay in CASES]
    for r in rows:
        r["rss_over_baseline_mib"] = r["peak_rss_mib"] - base["peak_rss_mib"]
    load = {"before": load_before, "after_side_by_side": load_mid, "after": os.getloadavg()}
    if args.json:
        print(json.dumps({"load_average": load, "side_by_side": pairs, "baseline": base, "cases": rows}, indent=1))
        return
    cmd = "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_influence.py " + " ".join(sys.argv[1:])
    print(f"N = {args.n}, H = {args.depth}; load average (1, 5, 15 min) before "
          f"{' '.join(f'{x:.2f}' for x in load_before)}, after the side-by-side {' '.join(f'{x:.2f}' for x in load_mid)}; "
          f"{cmd.strip()}")
    print(f"side by side in one process, {args.repeats} interleaved repeats (CPU s: median, best):")
    print(f"{'spec':24} {'alpha':>5} {'method':>9} {'median':>8} {'/anchor':>8} {'best':>8} {'/anchor':>8} "
          f"{'peak MiB':>9} {'max rel diff':>12}")
    for p in pairs:
        for name in METHODS:
            m = p[name]
            print(f"{p['spec']:24} {p['alpha']:>5g} {name:>9} {m['cpu_s']:>8.4f} {m['ratio_to_anchor']:>7.2f}x "
                  f"{m['cpu_s_best']:>8.4f} {m['best_ratio_to_anchor']:>7.2f}x {m['peak_mib']:>9.1f} "
                  f"{m['max_rel_diff']:>12.1e}")
    print(f"\neach case in a fresh process; load average after {' '.join(f'{x:.2f}' for x in load['after'])}; "
          f"baseline process {base['peak_rss_mib']:.0f} MiB")
    print(f"{'spec':48} {'alpha':>5} {'decay':>5} {'method':>9} {'wall s':>7} {'CPU s':>6} {'+MiB':>6} "
          f"{'first mass':>10} {'horizon':>7}")
    for r in rows:
        print(f"{r['spec']:48} {r['alpha']:>5g} {r['decay']:>5g} {r['method']:>9} {r['wall_s']:>7.2f} "
              f"{r['cpu_s']:>6.2f} {r['rss_over_baseline_mib']:>6.0f} {r['first_token_mass']:>10.3g} "
              f"{r['effective_horizon']:>7}")


if __name__ == "__main__":
    main()
