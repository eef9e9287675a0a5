"""Long sequences: the windowed kernel against FlexAttention and dense SDPA, in one run.

Workload (theory.md §2, pure SA): ``X <- A X W_V`` with
``A = softmax_G(X W_Q (X W_K)^T)``, G = ``causal_sliding_window:w=256``, d = 64, one
head, 8 layers, the same seeded weights (``random_layers(64, 8, seed=0)``), μ recorded
after every layer, float32. Every case runs in its own child process, so that its
peak RSS (``ru_maxrss``) is its own; ``import`` is the RSS after importing torch and
rankcollapse, before any work. Cases:

- ``ours``: ``simulate(..., run=RunConfig(backend="blocked", ...))`` (the windowed kernel, :mod:`rankcollapse.dynamics.sparse`);
- ``loop``: the previous blocked path, a Python loop over query blocks (kept here, verbatim
  in spirit, as the baseline the kernel replaced);
- ``flex``: what a user would write with FlexAttention: ``create_block_mask`` +
  ``torch.compile(flex_attention)``, μ by hand;
- ``sdpa``: ``F.scaled_dot_product_attention`` with the dense bool ``(N, N)`` mask.

``first`` is the first result in a fresh process (mask preparation, compilation and the
8 layers), ``again`` the same call repeated (steady state, best of 5). Then:

- N = 1,048,576 (``--million``): ours, time and peak RSS;
- mask analysis of window masks at N = 1,048,576 (``analyze``: closed forms);
- metrics at N = 65,536 (``compute_metrics``, d x d forms);
- ``to_block_mask`` (from the CSR form) against ``create_block_mask`` at N = 12,288: peak RSS;
- ``interleaved``: ours and flex steady state alternately in one process, best of 7 each
  in wall and in CPU seconds (the steady-state ratio least moved by other jobs on a
  shared machine; with one thread the CPU seconds are the work done).

Usage: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_long.py [--json] [--n 16384]
[--threads 2] [--skip-sdpa] [--million]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r'''
import json, math, resource, sys, time
import torch
import torch.nn.functional as F
from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.dynamics.weights import random_layers
from rankcollapse.masks import parse_mask

case, n, w, depth, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # MiB
out = {"case": case, "import_mib": rss()}
spec = f"causal_sliding_window:w={w}"
d = 64


def mu(X):
    return float(torch.linalg.vector_norm(X - X.mean(1, keepdim=True)))


def layers():
    return [lw.to(torch.float32, "cpu") for lw in random_layers(d, depth, seed=0)]


def hand_loop(X, attend):
    mus = [mu(X)]
    for lw in layers():
        Q, K, V = ((X @ W).unsqueeze(1) for W in (lw.W_Q, lw.W_K, lw.W_V))
        X = attend(Q, K, V).squeeze(1)
        mus.append(mu(X))
    return mus


def old_loop_attention(Q, K, V, blocks):
    """The previous blocked path: one SDPA call per query block, in Python."""
    out = torch.empty_like(V)
    for start, stop, k0, k1, local in blocks:
        out[..., start:stop, :] = F.scaled_dot_product_attention(
            Q[..., start:stop, :], K[..., k0:k1, :], V[..., k0:k1, :], attn_mask=local, scale=1.0)
    return out


def old_blocks(csr, size=128):
    import numpy as np
    blocks = []
    for s in range(0, csr.shape[0], size):
        e = min(s + size, csr.shape[0])
        cols = csr.indices[csr.indptr[s]:csr.indptr[e]]
        k0, k1 = int(cols.min()), int(cols.max()) + 1
        rows = np.repeat(np.arange(e - s), np.diff(csr.indptr[s:e + 1]))
        local = np.zeros((e - s, k1 - k0), dtype=bool)
        local[rows, cols - k0] = True
        blocks.append((s, e, k0, k1, torch.as_tensor(local)))
    return blocks


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def cpu_timed(fn):
    """(wall seconds, CPU seconds of this process: every thread, spinning included)."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


X = torch.randn(1, n, d, generator=torch.Generator().manual_seed(0))
if case == "interleaved":  # ours and flex alternately in one process: load changes hit both alike
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    bm = create_block_mask(lambda b, h, q, kv: (kv <= q) & (q - kv < w), None, None, n, n, device="cpu")
    runs = {"ours": lambda: simulate(X, spec, metrics=("mu",), run=RunConfig(depth=depth, backend="blocked")),
            "flex": lambda: hand_loop(X, lambda Q, K, V: flex(Q, K, V, block_mask=bm, scale=1.0))}
    times = {k: [] for k in runs}
    for fn in runs.values():
        fn()
    for _ in range(7):
        for k, fn in runs.items():
            times[k].append(cpu_timed(fn))
    best = {k: min(t[0] for t in v) for k, v in times.items()}
    cpu = {k: min(t[1] for t in v) for k, v in times.items()}
    print(json.dumps(out | {"best_of_7": best, "flex_over_ours": best["flex"] / best["ours"],
                            "best_of_7_cpu": cpu, "flex_over_ours_cpu": cpu["flex"] / cpu["ours"]}))
    sys.exit()
if case == "ours":
    run = lambda: simulate(X, spec, metrics=("mu",), run=RunConfig(depth=depth, backend="blocked")).metrics["mu"][:, 0].tolist()
elif case == "loop":
    def run():
        blocks = old_blocks(parse_mask(spec, n).to_csr())
        return hand_loop(X, lambda Q, K, V: old_loop_attention(Q, K, V, blocks))
elif case == "flex":
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    state = {}
    def run():
        if "bm" not in state:
            state["bm"] = create_block_mask(lambda b, h, q, kv: (kv <= q) & (q - kv < w), None, None, n, n, device="cpu")
        return hand_loop(X, lambda Q, K, V: flex(Q, K, V, block_mask=state["bm"], scale=1.0))
elif case == "sdpa":
    def run():
        M = parse_mask(spec, n).to_dense()
        return hand_loop(X, lambda Q, K, V: F.scaled_dot_product_attention(Q, K, V, attn_mask=M, scale=1.0))
elif case == "analysis":
    from rankcollapse.masks import analyze
    res = {}
    for s in (f"causal_sliding_window:w={w}", f"sliding_window:w={w + 1}"):
        t, a = timed(lambda: analyze(parse_mask(s, n)))
        res[s] = {"seconds": t, "radius": a.radius, "diameter": a.diameter, "qsc": a.quasi_strongly_connected,
                  "n_centers": len(a.centers), "method": a.method}
    print(json.dumps(out | {"analysis": res, "peak_mib": rss()}))
    sys.exit()
elif case == "metrics":
    from rankcollapse.metrics import compute_metrics
    names = ("mu", "mu_relative", "avg_cos", "avg_abs_cos", "cos_to_mean", "numerical_rank", "rank_fraction",
             "sigma_min", "sigma_ratio", "stable_rank", "effective_rank", "rank_one_distance")
    Y = torch.randn(1, n, d, generator=torch.Generator().manual_seed(1))
    res = {}
    for name in names:
        compute_metrics(Y[:, :256], (name,))
        res[name] = timed(lambda: compute_metrics(Y, (name,)))[0]
    res["all_together"] = timed(lambda: compute_metrics(Y, names))[0]
    print(json.dumps(out | {"metrics_seconds": res, "peak_mib": rss()}))
    sys.exit()
elif case in ("to_block_mask", "create_block_mask"):
    from rankcollapse.masks.convert import to_block_mask
    m = parse_mask(spec, n)
    m.to_csr()
    out["import_mib"] = rss()
    if case == "to_block_mask":
        t, _ = timed(lambda: to_block_mask(m))
    else:
        from torch.nn.attention.flex_attention import create_block_mask
        t, _ = timed(lambda: create_block_mask(m.mask_mod, None, None, n, n, device="cpu"))
    print(json.dumps(out | {"seconds": t, "peak_mib": rss()}))
    sys.exit()
first, mus = timed(run)
out |= {"first": first, "peak_first_mib": rss(), "mu": mus}
if (case != "sdpa" or "--again" in sys.argv) and "--once" not in sys.argv:
    out["again"] = min(timed(run)[0] for _ in range(5))  # best of 5: the machine may be shared
out["peak_mib"] = rss()
print(json.dumps(out))
'''


def child(case: str, n: int, w: int, depth: int, threads: int, *extra: str) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, case, str(n), str(w), str(depth), str(threads), *extra],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return {"case": case, "error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--w", type=int, default=256)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-sdpa", action="store_true", help="skip dense SDPA (~40 s, ~4 GB at N = 16,384)")
    ap.add_argument("--million", action="store_true", help="also run N = 1,048,576 (~1-2 min)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    common = (args.n, args.w, args.depth, args.threads)
    load_before = os.getloadavg()[0]
    cases = ["ours", "flex", "loop"] + ([] if args.skip_sdpa else ["sdpa"])
    res = {c: child(c, *common) for c in cases}
    ours = res["ours"]
    ratios = {}
    for c in cases[1:]:
        r = res[c]
        if "error" in r or "error" in ours:
            continue
        ratios[c] = {"first_over_ours_first": r["first"] / ours["first"],
                     "again_over_ours_again": r.get("again", r["first"]) / ours["again"],
                     "peak_mib_over_ours": r["peak_mib"] / ours["peak_mib"],
                     "mu_agrees_rtol_1e-3": all(abs(a - b) <= 1e-3 * abs(b) for a, b in zip(ours["mu"], r["mu"]))}
    extra = {"interleaved": child("interleaved", *common),
             "analysis": child("analysis", 2**20, args.w, 1, args.threads),
             "metrics": child("metrics", 65536, args.w, 1, args.threads),
             "to_block_mask": child("to_block_mask", 12288, args.w, 1, args.threads),
             "create_block_mask": child("create_block_mask", 12288, args.w, 1, args.threads)}
    if args.million:
        extra["million"] = child("ours", 2**20, args.w, args.depth, args.threads, "--once")
        extra["million"].pop("mu", None)
    doc = {"n": args.n, "w": args.w, "depth": args.depth, "threads": args.threads, "cases": res, "ratios": ratios,
           **extra, "load_average_1min": [load_before, os.getloadavg()[0]]}
    if args.json:
        print(json.dumps(doc))
        return
    print(f"pure SA, causal_sliding_window:w={args.w}, d=64, {args.depth} layers, mu per layer, float32, "
          f"{args.threads} threads; each case in its own process; 1-min load average "
          f"{doc['load_average_1min'][0]:.2f} before, {doc['load_average_1min'][1]:.2f} after")
    print(f"{'case':8s} {'first s':>9s} {'again s':>9s} {'peak MiB':>9s} {'import MiB':>10s}")
    for c, r in res.items():
        if "error" in r:
            print(f"{c:8s} error: {r['error']}")
            continue
        print(f"{c:8s} {r['first']:9.3f} {r.get('again', float('nan')):9.3f} {r['peak_mib']:9.0f} {r['import_mib']:10.0f}")
    for c, r in ratios.items():
        print(f"{c} / ours: first {r['first_over_ours_first']:.1f}x, again {r['again_over_ours_again']:.1f}x, "
              f"peak memory {r['peak_mib_over_ours']:.2f}x, mu agrees: {r['mu_agrees_rtol_1e-3']}")
    for k, v in extra.items():
        print(k, json.dumps(v))


if __name__ == "__main__":
    main()
