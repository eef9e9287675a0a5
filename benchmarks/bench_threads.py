"""Thread settings of every command, on an idle and on a loaded machine: wall and CPU seconds.

Each command runs in a fresh process under three settings: one intra-op thread
(``OMP_NUM_THREADS=1``), two threads with OpenMP's default waiting (``OMP_WAIT_POLICY``
unset), and two threads with ``OMP_WAIT_POLICY=PASSIVE`` (a thread waiting at a barrier
sleeps instead of spinning). "Loaded" starts ``--load`` busy processes (pure-Python
loops, one per core by default) beside the command, the way other jobs share these cores.
Settings alternate within each round so that the machine's drift falls on all of them.

Usage: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_threads.py [--rounds 3] [--json]``
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

SETTINGS = {
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "2 threads": {"OMP_NUM_THREADS": "2"},
    "2 threads, passive": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
}


def commands(tmp: str) -> dict[str, list[str]]:
    """Representative commands: small batched layers, a long windowed sequence, a model
    forward, a phase grid."""
    cli = ["-m", "rankcollapse.cli"]
    return {
        "simulate (8, 128, 64) x 32, pre-LN": [*cli, "simulate", "--n-tokens", "128", "--d-model", "64", "--depth", "32",
                                               "--n-samples", "8", "--mask", "causal", "--norm", "layernorm", "--placement", "pre_ln",
                                               "--format", "json"],
        "simulate N=16384 window 256 x 8": [*cli, "simulate", "--n-tokens", "16384", "--d-model", "64", "--depth", "8",
                                            "--n-samples", "1", "--mask", "causal_sliding_window:w=256",
                                            "--format", "json"],
        "probe MiniLM 8 x 128": [*cli, "probe", "--model", "minilm", "--n-samples", "8", "--n-tokens", "128",
                                 "--format", "json"],
        "phase 6 cells, depth 64": [*cli, "phase", "--axis", "norm=none,layernorm,sphere", "--axis", "mask=causal,complete",
                                    "--depth", "64", "--n-tokens", "32", "--d-model", "16", "--n-samples", "4",
                                    "--format", "json", "--out", os.path.join(tmp, "phase")],
    }


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.decode()[-400:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=int, default=os.cpu_count() or 2, help="busy processes in the loaded case")
    parser.add_argument("--only", default="", help="comma-separated substrings of command labels")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for key in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        base.pop(key, None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cmds = {k: v for k, v in commands(tmp).items()
                if not args.only or any(s in k for s in args.only.split(","))}
        for label, argv in cmds.items():
            run_once(argv, {**base, "OMP_NUM_THREADS": "1"})  # warm the page cache
        for machine in ("idle", "loaded"):
            procs = busy(args.load) if machine == "loaded" else []
            try:
                time.sleep(1.0 if procs else 0.0)
                load = os.getloadavg()[0]
                for label, argv in cmds.items():
                    times: dict[str, list[tuple[float, float]]] = {s: [] for s in SETTINGS}
                    for _ in range(args.rounds):
                        for setting, extra in SETTINGS.items():
                            times[setting].append(run_once(argv, {**base, **extra}))
                    for setting, pairs in times.items():
                        rows.append({"machine": machine, "command": label, "setting": setting, "load_1min": load,
                                     "wall_s": statistics.median(p[0] for p in pairs),
                                     "cpu_s": statistics.median(p[1] for p in pairs)})
            finally:
                for p in procs:
                    p.kill()
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'machine':7} {'command':38} {'setting':20} {'wall s':>7} {'CPU s':>7}  load")
    for r in rows:
        print(f"{r['machine']:7} {r['command']:38} {r['setting']:20} {r['wall_s']:7.2f} {r['cpu_s']:7.2f}  "
              f"{r['load_1min']:.1f}")


if __name__ == "__main__":
    main()
