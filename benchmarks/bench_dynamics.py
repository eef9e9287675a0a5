"""Benchmarks of the dynamics simulator, all ratios measured in one run.

Workload: a pure-SA run (theory.md §2), ``X <- A X W_V`` with
``A = softmax_causal(X W_Q (X W_K)^T)``, B=64, N=128, d=384, float32, one head, 64 layers
(16 with ``--quick``), μ recorded after every layer.

Both sides do the same work and record the same numbers:

- ``ours``: ``simulate(X, "causal", metrics=("mu",), run=RunConfig(depth=T))``;
- ``sdpa loop``: what a user would write: per layer ``Q, K, V = X W_Q, X W_K, X W_V``
  (three matmuls), ``F.scaled_dot_product_attention`` with the dense bool mask, and
  μ = ``||X - mean||_F`` by hand.

Two pairings, interleaved (ours, loop, ours, loop, ...), best of ``--repeats``:

- ``draw inside``: both draw the layers' weights inside the timed call with the same
  seeded float64 draws (``random_layers``; simulate does this itself, the loop calls
  it and casts to float32), so both use identical weights and μ must agree;
- ``pre-drawn``: neither draws; ``simulate(..., weights=layers)`` against the loop on the
  same float32 layers.

Fraction of peak = FLOPs / time / (fp32 matmul peak: a 2048^3 matmul, interleaved with
the cases, best of ``--repeats``). ``nominal`` FLOPs are those of the straightforward algorithm (three projections,
full N x N scores and A V); ``executed`` FLOPs are what ``simulate`` performs (one
``(d, 2d)`` projection ``X [W_Q W_K^T | W_V]``, keys = X, full scores and A V).

3. ``causal_sliding_window:w=256`` at N = 65,536, d = 64, 8 layers (blocked path), in a
   child process: wall time and peak RSS (the child's own ``ru_maxrss``).

Usage: ``.venv/bin/python benchmarks/bench_dynamics.py [--json] [--quick] [--threads 1]``
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.dynamics.weights import random_layers

LONG_CHILD = """
import resource, sys, time, torch
if int(sys.argv[1]) > 0:
    torch.set_num_threads(int(sys.argv[1]))
from rankcollapse.dynamics import RunConfig, simulate
X = torch.randn(1, 65536, 64, generator=torch.Generator().manual_seed(0))
t0 = time.perf_counter()
r = simulate(X, "causal_sliding_window:w=256", metrics=("mu",), run=RunConfig(depth=8, record_epsilon=True))
print(time.perf_counter() - t0, r.config["backend"], float(r.metrics["mu"][-1, 0]),
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


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


def _layers_within(mu: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-3) -> int:
    """Layers (after the input) whose μ is within ``rtol`` of ``ref`` for every sample."""
    bad = ((mu - ref).abs() > rtol * ref.abs()).any(dim=1)
    return int(bad.nonzero()[0, 0]) - 1 if bool(bad.any()) else mu.shape[0] - 1


def _draw(d: int, T: int):
    return [lw.to(torch.float32, "cpu") for lw in random_layers(d, T, seed=0)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="16 layers instead of 64; skip the long run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = default); on an oversubscribed "
                    "machine 1 avoids OpenMP barrier stalls on the many small block operations")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    B, N, d, T = 64, 128, 384, 16 if args.quick else 64
    X = torch.randn(B, N, d, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(N, N, dtype=torch.bool).tril()
    layers = _draw(d, T)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    nominal = T * (3 * 2 * B * N * d * d + 2 * 2 * B * N * N * d)  # 3 projections + scores + A V
    executed = T * (2 * 2 * B * N * d * d + 2 * 2 * B * N * N * d)  # 2 projections + scores + A V
    cases = {
        ("peak", "matmul"): lambda: a @ b,
        ("draw inside", "ours"): lambda: simulate(X, mask=mask, metrics=("mu",), run=RunConfig(depth=T)),
        ("draw inside", "sdpa loop"): lambda: sdpa_loop(X, mask, _draw(d, T), 1.0),
        ("pre-drawn", "ours"): lambda: simulate(X, mask=mask, weights=layers, metrics=("mu",), run=RunConfig(depth=T)),
        ("pre-drawn", "sdpa loop"): lambda: sdpa_loop(X, mask, layers, 1.0),
    }
    times = {k: [] for k in cases}
    for fn in cases.values():  # warm-up
        fn()
    for _ in range(args.repeats):  # interleaved: load changes on a shared machine hit every case alike
        for k, fn in cases.items():
            times[k].append(_timed(fn))
    best = {k: min(v) for k, v in times.items()}
    peak = 2 * 2048**3 / best[("peak", "matmul")]
    # Agreement: hard-max-like attention makes this run chaotic, so any float32 run leaves
    # the float64 one after some layers; report for each side how many layers stay
    # within 1e-3 of a float64 sdpa loop (same weights), and whether both agree early.
    ref = sdpa_loop(X.double(), mask, [lw.to(torch.float64, "cpu") for lw in random_layers(d, T, seed=0)], 1.0)
    ours_mu = simulate(X, mask=mask, metrics=("mu",), run=RunConfig(depth=T)).metrics["mu"]
    loop_mu = sdpa_loop(X, mask, layers, 1.0).double()
    out = {"depth": T, "shape": [B, N, d], "threads": torch.get_num_threads(), "repeats": args.repeats,
           "matmul_peak_gflops": peak / 1e9}
    for pairing in ("draw inside", "pre-drawn"):
        key = pairing.replace(" ", "_").replace("-", "_")
        ours, base = best[(pairing, "ours")], best[(pairing, "sdpa loop")]
        out |= {f"{key}.ours_seconds": ours, f"{key}.sdpa_loop_seconds": base,
                f"{key}.speedup_vs_sdpa_loop": base / ours,
                f"{key}.fraction_of_peak_nominal": nominal / ours / peak,
                f"{key}.fraction_of_peak_executed": executed / ours / peak}
    out["mu_agrees_with_sdpa_loop_first_4_layers"] = bool(torch.allclose(ours_mu[:5], loop_mu[:5], rtol=1e-4))
    out["ours_layers_within_1e-3_of_float64"] = _layers_within(ours_mu, ref)
    out["sdpa_loop_layers_within_1e-3_of_float64"] = _layers_within(loop_mu, ref)
    if not args.quick:
        t0 = time.perf_counter()
        child = subprocess.run([sys.executable, "-c", LONG_CHILD, str(args.threads)], capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t0
        secs, path, _, peak_kib = child.stdout.split()
        # the child's own ru_maxrss, read inside it: RUSAGE_CHILDREN in this (large) parent
        # would also count the parent's pages the child held between fork and exec
        out |= {"long_seconds_in_simulate": float(secs), "long_wall_seconds_incl_import": wall, "long_path": path, "threads": torch.get_num_threads(),
                "long_peak_rss_gib": int(peak_kib) / 2**20,
                "dense_scores_gib_per_head": 65536**2 * 4 / 2**30}
    if args.json:
        print(json.dumps(out))
        return
    print(f"pure SA, causal, (B, N, d) = {(B, N, d)}, {T} layers, mu per layer, float32, "
          f"{out['threads']} threads, best of {args.repeats} interleaved")
    print("ours = simulate(); sdpa loop = 3 matmuls + F.scaled_dot_product_attention(dense bool mask) + mu by hand")
    print("draw inside: both draw the same seeded weights in the timed call; pre-drawn: neither does")
    for k, v in out.items():
        print(f"{k:44s} {v:.4g}" if isinstance(v, float) else f"{k:44s} {v}")


if __name__ == "__main__":
    main()
