"""Benchmarks of the dynamics simulator (issue 5), all ratios measured in one run.

1. 64-layer pure-SA run, (B=64, N=128, d=384), μ recorded each layer: achieved FLOP/s
   as a fraction of this machine's fp32 matmul peak (a 2048^3 matmul, best of 3).
2. The same run against a straightforward per-layer loop over
   ``F.scaled_dot_product_attention`` with a dense bool mask and μ by hand.
3. ``causal_sliding_window:w=256`` at N = 65,536, d = 64, 8 layers (blocked path), in a
   child process: wall time and peak RSS (``resource.getrusage(RUSAGE_CHILDREN)``).

Usage: ``.venv/bin/python benchmarks/bench_dynamics.py [--json] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from rankcollapse.dynamics import simulate
from rankcollapse.dynamics.weights import random_layers

LONG_CHILD = """
import sys, time, torch
if int(sys.argv[1]) > 0:
    torch.set_num_threads(int(sys.argv[1]))
from rankcollapse.dynamics import simulate
X = torch.randn(1, 65536, 64, generator=torch.Generator().manual_seed(0))
t0 = time.perf_counter()
r = simulate(X, mask="causal_sliding_window:w=256", depth=8, metrics=("mu",), record_epsilon=True)
print(time.perf_counter() - t0, r.config["path"], float(r.metrics["mu"][-1, 0]))
"""


def matmul_peak(n: int = 2048, repeats: int = 3) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def sdpa_loop(X, mask, layers, d_qk):
    """What a user would write: project, SDPA with a dense bool mask, μ by hand."""
    mus = [torch.linalg.vector_norm(X - X.mean(1, keepdim=True), dim=(1, 2))]
    for lw in layers:
        Q, K, V = (X @ lw.W_Q).unsqueeze(1), (X @ lw.W_K).unsqueeze(1), (X @ lw.W_V).unsqueeze(1)
        X = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, scale=1 / math.sqrt(d_qk)).squeeze(1)
        mus.append(torch.linalg.vector_norm(X - X.mean(1, keepdim=True), dim=(1, 2)))
    return torch.stack(mus)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="16 layers instead of 64; skip the long run")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = default); on an oversubscribed "
                    "machine 1 avoids OpenMP barrier stalls on the many small block operations")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    B, N, d, T = 64, 128, 384, 16 if args.quick else 64
    X = torch.randn(B, N, d, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(N, N, dtype=torch.bool).tril()
    layers = [lw.to(torch.float32, "cpu") for lw in random_layers(d, T, seed=0)]
    peak = matmul_peak()
    flops = T * (3 * 2 * B * N * d * d + 2 * 2 * B * N * N * d)  # projections + scores + A V
    ours, base = [], []
    for _ in range(3):  # interleaved, best of 3: the machine may be shared
        ours.append(_timed(lambda: simulate(X, mask=mask, depth=T, metrics=("mu",))))
        base.append(_timed(lambda: sdpa_loop(X, mask, layers, 1.0)))
    ours_t, base_t = min(ours), min(base)
    res = simulate(X, mask=mask, depth=T, metrics=("mu",))
    agree = torch.allclose(res.metrics["mu"].float(), sdpa_loop(X, mask, layers, 1.0), rtol=1e-3)
    out = {"matmul_peak_gflops": peak / 1e9, "sim_seconds": ours_t, "sim_gflops": flops / ours_t / 1e9,
           "fraction_of_peak": flops / ours_t / peak, "sdpa_loop_seconds": base_t, "speedup_vs_sdpa_loop":
           base_t / ours_t, "mu_agrees_with_sdpa_loop": bool(agree), "depth": T, "shape": [B, N, d]}
    if not args.quick:
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.perf_counter()
        child = subprocess.run([sys.executable, "-c", LONG_CHILD, str(args.threads)], capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t0
        secs, path, _ = child.stdout.split()
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        out |= {"long_seconds_in_simulate": float(secs), "long_wall_seconds_incl_import": wall, "long_path": path, "threads": torch.get_num_threads(),
                "long_peak_rss_gib": max(peak_kib, usage0) / 2**20,
                "dense_scores_gib_per_head": 65536**2 * 4 / 2**30}
    if args.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:34s} {v:.4g}" if isinstance(v, float) else f"{k:34s} {v}")


if __name__ == "__main__":
    main()
