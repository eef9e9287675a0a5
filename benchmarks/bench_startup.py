"""Start-up time of the command line: wall and CPU seconds of whole commands.

Each command runs ``--repeats`` times in a fresh interpreter (``python -m
rankcollapse.cli ...``, output discarded); the table gives the median wall time and the
median CPU time (user + system of the child, from ``getrusage``), the number that
predicts the time on an idle machine of another speed. Goals (idle machine):
``--help`` and ``--version`` under 0.5 s, ``mask describe`` of a 64-token mask under
1.5 s. The load average is printed with the table: on a shared machine wall time
grows with it, CPU time much less. ``python -c pass`` and ``import torch`` are
reference rows (the interpreter alone, and what the light commands avoid).

Usage: .venv/bin/python benchmarks/bench_startup.py [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOALS = {"--version": 0.5, "--help": 0.5, "mask describe": 1.5}


def cases(tmp: Path) -> list[tuple[str, list[str], float | None]]:
    """(label, argv after the interpreter, goal in seconds or None)."""
    cli = ["-m", "rankcollapse.cli"]
    x = tmp / "X.npy"
    import numpy as np

    np.save(x, np.random.default_rng(0).standard_normal((64, 16)))
    return [
        ("python -c pass", ["-c", "pass"], None),
        ("--version", [*cli, "--version"], GOALS["--version"]),
        ("--help", [*cli, "--help"], GOALS["--help"]),
        ("mask --help", [*cli, "mask", "--help"], None),
        ("mask describe causal_sliding_window:w=9, N=64",
         [*cli, "mask", "describe", "causal_sliding_window:w=9", "--n-tokens", "64"], GOALS["mask describe"]),
        ("mask describe longformer:w=9,globals=0, N=64 (json)",
         [*cli, "mask", "describe", "longformer:w=9,globals=0", "--n-tokens", "64", "--format", "json"],
         GOALS["mask describe"]),
        ("mask describe schedule:sliding_window:w=9*5,complete, N=64",
         [*cli, "mask", "describe", "schedule:sliding_window:w=9*5,complete", "--n-tokens", "64"], None),
        ("simulate --help", [*cli, "simulate", "--help"], None),
        ("metrics X.npy (64 x 16; imports torch)", [*cli, "metrics", str(x), "--format", "json"], None),
        ("import torch", ["-c", "import torch"], None),
    ]


def run_once(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env_note = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",) if os.environ.get(k)}
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, argv, goal in cases(Path(tmp)):
            run_once(argv)  # warm the file cache: every row then measures a warm start
            walls, cpus = zip(*(run_once(argv) for _ in range(args.repeats)))
            rows.append({"command": label, "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
                         "wall_min_s": min(walls), "goal_s": goal})
    load_after = os.getloadavg()
    if args.json:
        print(json.dumps({"repeats": args.repeats, "load_before": load_before, "load_after": load_after,
                          "env": env_note, "rows": rows}, indent=1))
        return
    print(f"{args.repeats} runs each, warm start, medians; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} CPUs) {env_note or ''}")
    print(f"{'command':58} {'wall s':>7} {'min s':>7} {'CPU s':>7} {'goal s':>7}")
    for r in rows:
        goal = "" if r["goal_s"] is None else f"{r['goal_s']:.1f}"
        print(f"{r['command']:58} {r['wall_s']:>7.2f} {r['wall_min_s']:>7.2f} {r['cpu_s']:>7.2f} {goal:>7}")


if __name__ == "__main__":
    main()
