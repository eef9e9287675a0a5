"""Sweep engine: speed-up from 1 to 2 worker processes, and the per-unit overhead of
the Ray executor against serial.

1. Speed-up: the same real units (Fig. 3 pretrained self-attention networks on MiniLM
   windows) through warm process pools of 1 and 2 workers (pool start and model loading
   excluded: a one-off cost per run, reported separately), alternately, ``--repeats``
   times; ratio of medians. Goal >= 1.7x on 2 cores.
2. Ray overhead: tiny real units (1 window each) in this process vs as tasks of a
   private 1-CPU Ray instance (warm worker), alternately; (ray - serial) / units.
   Goal < 50 ms per unit.

Machines here are shared: both sides of each ratio are measured in the same run,
interleaved, and the load average is printed with the result.

    .venv/bin/python benchmarks/bench_sweep.py [--windows 24] [--units 8] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rankcollapse.experiments import runner  # noqa: E402
from rankcollapse.sweep.executors import ProcessExecutor, RayExecutor, SerialExecutor  # noqa: E402
from rankcollapse.sweep.units import unit_functions  # noqa: E402


def _units(windows: int, n: int):
    _, units, data = runner.plan("fig3", "smoke", 0, overrides={"n_samples": windows})
    return units[:n], data


def _drain(executor, units, ctx, cpu: list | None = None) -> float:
    """Wall seconds to run ``units``; appends the units' summed CPU seconds to ``cpu``."""
    t0, used = time.perf_counter(), 0.0
    for done in executor.map(units, ctx, unit_functions(units)):
        used += done.cpu
    wall = time.perf_counter() - t0
    if cpu is not None:
        cpu.append(used / wall)
    return wall


def speedup(windows: int, n: int, repeats: int) -> dict:
    units, data = _units(windows, n)
    ctx = runner.RunContext(data, "cpu")
    pools = {w: ProcessExecutor(w, data, "cpu") for w in (1, 2)}
    start = {}
    try:
        for w, ex in pools.items():  # start the workers and load the model in each
            start[w] = _drain(ex, units[:w], ctx)
        times, cores = {1: [], 2: []}, {1: [], 2: []}
        for _ in range(repeats):
            for w, ex in pools.items():
                times[w].append(_drain(ex, units, ctx, cores[w]))
    finally:
        for ex in pools.values():
            ex.close()
    med = {w: statistics.median(t) for w, t in times.items()}
    return {"units": len(units), "windows": windows, "seconds_1_worker": round(med[1], 2),
            "seconds_2_workers": round(med[2], 2), "speedup": round(med[1] / med[2], 2),
            "pool_start_and_load_s": {w: round(s, 1) for w, s in start.items()},
            # CPU seconds of the units per wall second: the cores the workers actually got
            "cores_obtained": {w: round(statistics.median(c), 2) for w, c in cores.items()}}


def ray_overhead(n: int, repeats: int) -> dict:
    units, data = _units(1, n)
    ctx = runner.RunContext(data, "cpu")
    serial, ray_ex = SerialExecutor(), RayExecutor(None, 1, data, "cpu")
    try:
        _drain(serial, units, ctx)  # load the model here and in the Ray worker
        _drain(ray_ex, units, ctx)
        times = {"serial": [], "ray": []}
        for _ in range(repeats):
            times["serial"].append(_drain(serial, units, ctx))
            times["ray"].append(_drain(ray_ex, units, ctx))
    finally:
        ray_ex.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"units": len(units), "serial_per_unit_ms": round(1e3 * med["serial"] / len(units), 1),
            "ray_per_unit_ms": round(1e3 * med["ray"] / len(units), 1),
            "overhead_per_unit_ms": round(1e3 * (med["ray"] - med["serial"]) / len(units), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=24, help="windows per unit of the speed-up units")
    ap.add_argument("--units", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    res = {"cores": os.cpu_count(), "speedup": speedup(args.windows, args.units, args.repeats)}
    if not args.skip_ray:
        res["ray"] = ray_overhead(12, args.repeats)
    res["load_average_1min"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    if args.json:
        print(json.dumps(res, indent=2))
        return
    s = res["speedup"]
    print(f"speed-up 1 -> 2 workers: {s['speedup']}x ({s['units']} units of {s['windows']} windows: "
          f"{s['seconds_1_worker']} s vs {s['seconds_2_workers']} s; goal >= 1.7x)")
    print(f"  pool start + model load (once per run): {s['pool_start_and_load_s']} s")
    print(f"  cores obtained (unit CPU s per wall s): {s['cores_obtained']}; speed-up per core obtained: "
          f"{s['speedup'] / (s['cores_obtained'][2] / s['cores_obtained'][1]):.2f}")
    if "ray" in res:
        r = res["ray"]
        print(f"ray overhead per unit: {r['overhead_per_unit_ms']} ms (serial {r['serial_per_unit_ms']} ms, "
              f"ray {r['ray_per_unit_ms']} ms per unit; goal < 50 ms)")
    print(f"load average (1 min) before/after: {res['load_average_1min']} on {res['cores']} cores")


if __name__ == "__main__":
    main()
