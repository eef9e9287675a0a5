"""Run every benchmark in turn, each in its own process, and print their tables.

Usage: ``python benchmarks/run_all.py [--quick]``. Each script measures its ratios
within one run (these machines are shared and noisy: compare ratios, not times).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

SCRIPTS = {
    "masks": ["bench_masks.py"],
    "influence": ["bench_influence.py"],
    "metrics": ["bench_metrics.py"],
    "dynamics": ["bench_dynamics.py"],
    "long": ["bench_long.py"],
    "recorder": ["bench_recorder.py"],
    "sweep": ["bench_sweep.py"],
    "startup": ["bench_startup.py"],
    "probe": ["bench_probe.py"],
}
QUICK = {
    "masks": ["--n", "16384"],
    "influence": ["--n", "16384"],
    "metrics": ["--shape", "64", "128", "768"],
    "dynamics": ["--quick"],
    "long": ["--n", "4096", "--skip-sdpa"],
    "recorder": ["--repeats", "3"],
    "sweep": ["--repeats", "1", "--units", "4", "--windows", "8"],
    "startup": ["--repeats", "2"],
    "probe": ["--models", "minilm"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    ap.add_argument("--only", choices=sorted(SCRIPTS), nargs="*", help="run only these")
    args = ap.parse_args()
    status = 0
    for name, (script, *rest) in SCRIPTS.items():
        if args.only and name not in args.only:
            continue
        cmd = [sys.executable, str(HERE / script), *rest, *(QUICK[name] if args.quick else [])]
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        status |= subprocess.run(cmd).returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
