"""Phase cells against a plain batched torch loop, in one process, interleaved.

The grid is docs/phase.md's first example: ``qk_scale`` 0.25, 1, 4 × ``norm`` none, sphere,
layernorm × ``mask`` complete, causal (18 cells; depth 64, N 32, d 16, 4 samples, float64).

- **project**: :func:`rankcollapse.phase.batched.run_group` on each group of cells that share
  a batch (what a ``phase_cell`` unit runs), rows and labels included.
- **anchor**: the same layers written plainly in torch (one batch per group, dense masked
  softmax, the norm, X W_V) with the per-layer quantities the cells are labelled from
  (μ, μ/‖X‖_F, mean pairwise cosine, row entropy, smallest allowed entry), and nothing else.
- **profile** (``--profile``): shares of the project's CPU time by part of ``run_group``
  (``time.process_time`` around each call of the part; a part marked ``of which`` is inside
  the part above it; the metrics are called by ``_measure`` and once on X(0)).
- **command** (``--command``): the whole ``rankcollapse phase`` command in a fresh process
  (CPU-seconds of the child), and a fresh process that only imports what the command
  imports (start-up: torch, pandas, scipy.stats, matplotlib); the rest is the cells and
  the report (heatmaps, JSON).

The ratio is of CPU-seconds (``time.process_time``), medians over ``--repeats`` interleaved
rounds (``ratio_of_rounds``: the median of each round's ratio, less moved by a change of load
between rounds), with the load average printed beside it: the 2 cores here are shared.

    .venv/bin/python benchmarks/bench_phase.py [--repeats 5] [--command] [--profile] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from rankcollapse.phase.batched import GROUP_KEYS, run_group
from rankcollapse.phase.cell import build_weights, make_input
from rankcollapse.phase.grid import expand_grid

AXES = {"qk_scale": [0.25, 1, 4], "norm": ["none", "sphere", "layernorm"], "mask": ["complete", "causal"]}
FIXED = {"depth": 64, "n_tokens": 32, "d_model": 16}
N_SAMPLES = 4


def groups() -> list[list[dict]]:
    cells = expand_grid(AXES, FIXED)
    out: dict[tuple, list[dict]] = {}
    for c in cells:
        out.setdefault(tuple(c[k] for k in GROUP_KEYS), []).append(c)
    return list(out.values())


def project(parts: list[list[dict]]) -> None:
    for cells in parts:
        run_group(cells, n_samples=N_SAMPLES)


def _anchor_inputs(cells: list[dict]):
    """Inputs and stacked weights of one group, drawn by the project's own functions
    (timed on both sides: run_group draws them too)."""
    first = cells[0]
    N, d, depth = first["n_tokens"], first["d_model"], first["depth"]
    X = torch.cat([make_input(first["input"], N_SAMPLES, N, d, 0)] * len(cells))
    ws = [build_weights(c, 0) for c in cells]
    stack = lambda name: torch.stack([torch.stack([getattr(w[t], name) for w in ws]) for t in range(depth)])  # noqa: E731
    rep = lambda W: W.repeat_interleave(N_SAMPLES, dim=1)  # noqa: E731  (depth, B, d, d)
    allowed = torch.ones(N, N, dtype=torch.bool)
    if first["mask"] == "causal":
        allowed = allowed.tril()
    return X, rep(stack("W_Q")), rep(stack("W_K")), rep(stack("W_V")), ws[0][0].scale, allowed, first["norm"]


def _norm(X: torch.Tensor, norm: str) -> torch.Tensor:
    if norm == "sphere":
        return X / X.norm(dim=-1, keepdim=True) * math.sqrt(X.shape[-1])
    if norm == "layernorm":
        return torch.nn.functional.layer_norm(X, X.shape[-1:])
    return X


def anchor(parts: list[list[dict]]) -> None:
    for cells in parts:
        X, WQ, WK, WV, scale, allowed, norm = _anchor_inputs(cells)
        k = allowed.sum(-1).to(X.dtype)
        for t in range(WQ.shape[0]):
            s = ((X @ WQ[t]) @ (X @ WK[t]).transpose(-1, -2) * scale).masked_fill(~allowed, -math.inf)
            A = torch.softmax(s, dim=-1)
            X = _norm(A @ X @ WV[t], norm)
            mean = X.mean(dim=-2, keepdim=True)
            mu = (X - mean).norm(dim=(-1, -2))
            _ = mu / X.norm(dim=(-1, -2))
            U = X / X.norm(dim=-1, keepdim=True)
            G = U @ U.transpose(-1, -2)
            n = X.shape[-2]
            _ = (G.sum(dim=(-1, -2)) - G.diagonal(dim1=-1, dim2=-2).sum(-1)) / (n * (n - 1))
            ent = -(A * torch.log(A.clamp_min(1e-300))).sum(-1) / torch.log(k.clamp_min(2))
            _ = ent.mean(-1)
            _ = A.masked_fill(~allowed, 1.0).amin(dim=(-1, -2))


#: label -> (module, function) of the parts of run_group whose CPU time --profile reports (a part
#: marked ``of which`` is inside the part above it)
PARTS = {
    "layers (single_head_layer)": ("rankcollapse.phase.batched", "single_head_layer"),
    "  of which masked_softmax": ("rankcollapse.dynamics.single_head", "masked_softmax"),
    "per-layer measures (_measure)": ("rankcollapse.phase.batched", "_measure"),
    "  of which row entropy": ("rankcollapse.phase.batched", "row_entropy"),
    "  of which mu, mu/||X||_F, mean cosine": ("rankcollapse.phase.batched", "_state_measure"),
    "weights (_stack)": ("rankcollapse.phase.batched", "_stack"),
    "trajectory measures": ("rankcollapse.phase.batched", "trajectory_measures"),
    "  of which tail rate": ("rankcollapse.phase.regime", "tail_rate"),
    "labels (label_cell)": ("rankcollapse.phase.batched", "label_cell"),
    "operator columns": ("rankcollapse.phase.batched", "operator_columns"),
    "envelope": ("rankcollapse.phase.batched", "_envelope"),
}


def profile_shares(parts: list[list[dict]], repeats: int) -> dict[str, float]:
    """Share of the project's CPU time spent in each of :data:`PARTS`, by ``time.process_time``
    around each call (the functions are wrapped where ``run_group`` looks them up; the
    metrics through the function :func:`~rankcollapse.phase.batched._state_measure` returns).
    A profiler's per-call overhead would inflate the parts made of many small calls."""
    import importlib

    spent = dict.fromkeys(PARTS, 0.0)

    def timed(label, fn):
        def wrapper(*args, **kwargs):
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.process_time() - start
        return wrapper

    saved = []
    for label, (module, name) in PARTS.items():
        mod = importlib.import_module(module)
        fn = getattr(mod, name)
        saved.append((mod, name, fn))
        if name == "_state_measure":  # a factory: time the measure it returns
            setattr(mod, name, lambda fn=fn, label=label: timed(label, fn()))
        else:
            setattr(mod, name, timed(label, fn))
    try:
        total = sum(_cpu(lambda: project(parts)) for _ in range(repeats))
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
    return {label: v / total for label, v in spent.items()}


def _cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def _command(extra: list[str]) -> float:
    """CPU-seconds (user + sys) of a child process running ``rankcollapse`` with ``extra``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "rankcollapse.cli", *extra], check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _imports() -> float:
    """CPU-seconds of a fresh process importing the modules the phase command runs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import rankcollapse.cli.phase, rankcollapse.phase.report, "
                    "rankcollapse.phase.sweep, rankcollapse.sweep.executors, matplotlib.pyplot"], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--command", action="store_true", help="also time the whole phase command")
    parser.add_argument("--profile", action="store_true", help="also print the shares of the cells' time by part")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    parts = groups()
    n_cells = sum(len(p) for p in parts)
    project(parts), anchor(parts)  # warm-up
    times: dict[str, list[float]] = {"project": [], "anchor": []}
    for _ in range(args.repeats):
        times["project"].append(_cpu(lambda: project(parts)))
        times["anchor"].append(_cpu(lambda: anchor(parts)))
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"cells": n_cells, "groups": len(parts), "load": os.getloadavg()[0],
           **{f"{k}_cpu_s": v for k, v in med.items()},
           **{f"{k}_cells_per_cpu_s": n_cells / v for k, v in med.items()},
           "ratio": med["project"] / med["anchor"],
           "ratio_of_rounds": statistics.median(p / a for p, a in zip(times["project"], times["anchor"]))}
    if args.command:
        with tempfile.TemporaryDirectory() as tmp:
            axes = [a for name, values in AXES.items() for a in ("--axis", f"{name}=" + ",".join(map(str, values)))]
            cmd = ["phase", *axes, "--depth", "64", "--n-tokens", "32", "--d-model", "16", "--n-samples", "4",
                   "--seed", "0", "--format", "json"]
            out["command_cpu_s"] = _command([*cmd, "--out", os.path.join(tmp, "run")])
            out["startup_cpu_s"] = _imports()
        out["rest_cpu_s"] = out["command_cpu_s"] - out["startup_cpu_s"] - med["project"]  # report, cache, CLI
    if args.profile:
        out["profile"] = profile_shares(parts, args.repeats)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            if k == "profile":
                print("   share of the cells' CPU time (timers around each part):")
                for label, share in v.items():
                    print(f"{label:>38}: {share:.1%}")
            else:
                print(f"{k:>28}: {v:.4g}" if isinstance(v, float) else f"{k:>28}: {v}")
    return out


if __name__ == "__main__":
    main()
