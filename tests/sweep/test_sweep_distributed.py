"""The same real sweep (smoke scale, MiniLM windows) under every executor: byte-identical
tables from serial, 2 worker processes and a real local Ray cluster; a Ray worker killed
mid-unit is retried, a killed process-pool worker is replaced, and a driver killed
mid-run resumes when the same command is rerun."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rankcollapse.experiments import runner

pytestmark = pytest.mark.slow
psutil = pytest.importorskip("psutil")
RAY = Path(sys.executable).with_name("ray")
CLI = [sys.executable, "-c", "from rankcollapse.cli import main; main()", "reproduce"]
# fig3's pretrained-network units (12 and its 2 control units, about a second each on one
# thread) and the first layer of the same at N = 128 and 1,024 (the claims' N axis: 22 units)
SWEEP = ["fig3", "--scale", "smoke", "--n-samples", "16", "--no-nearby", "--no-progress"]
N_UNITS = len(runner.plan("fig3", "smoke", 0, overrides={"n_samples": 16})[1])
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg", "RAY_USAGE_STATS_ENABLED": "0",
            # a private cluster bound to 127.0.0.1: no token authentication (Ray turns it on
            # when it finds a ~/.ray/auth_token left by an earlier local ray.init)
            "RAY_AUTH_MODE": "disabled"}


def _run(args, out, cache, **kw):
    return subprocess.run([*CLI, *args, "--out", str(out), "--cache-dir", str(cache)], capture_output=True, text=True,
                          env=_env(), timeout=600, **kw)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster():
    """A real Ray head node on 127.0.0.1 with 2 CPUs; its process group is killed at the end."""
    if not RAY.exists():
        pytest.fail("ray is not installed: pip install 'rankcollapse[distributed]' (make setup does)")
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths are limited
    proc = subprocess.Popen([str(RAY), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                             "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
                             f"--temp-dir={tmp}", "--block"], env=_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.time() + 400  # minutes on a loaded 2-core machine
        while subprocess.run([str(RAY), "status", f"--address={address}"], capture_output=True,
                             env=_env()).returncode != 0:
            assert proc.poll() is None and time.time() < deadline, "ray head did not start"
            time.sleep(2)
        yield address
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def serial_table(tmp_path_factory):
    """The reference: the sweep in this process's serial executor."""
    tmp = tmp_path_factory.mktemp("serial")
    proc = _run(SWEEP, tmp / "out", tmp / "cache")
    assert proc.returncode == 0, proc.stderr
    return (tmp / "out" / "table.parquet").read_bytes(), (tmp / "out" / "table.csv").read_bytes()


def _table(out):
    return (out / "table.parquet").read_bytes(), (out / "table.csv").read_bytes()


def test_smoke_sweep_tables_identical_serial_processes_ray(tmp_path, ray_cluster):
    args = ["all", "--scale", "smoke", "--n-samples", "2", "--depth", "4", "--no-nearby", "--no-progress"]
    tables = {}
    for name, extra in {"serial": [], "processes": ["--executor", "processes", "--workers", "2"],
                        "ray": ["--executor", "ray", "--address", ray_cluster]}.items():
        proc = _run(args + extra, tmp_path / name, tmp_path / f"cache-{name}")
        assert proc.returncode == 0, proc.stderr
        cfg = json.loads((tmp_path / name / "config.json").read_text())
        assert cfg["execution"]["executor"] == name and not any(t["cached"] for t in cfg["timings"])
        tables[name] = _table(tmp_path / name)
    assert tables["processes"] == tables["serial"] and tables["ray"] == tables["serial"]
    workers = {t["worker"] for t in json.loads((tmp_path / "processes" / "config.json").read_text())["timings"]}
    assert len(workers) == 2  # both worker processes ran units


def _kill_first(match, timeout=300):
    """kill -9 the first process whose command line starts with ``match``; its pid."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(p.info["cmdline"] or ())
            if cmd.startswith(match):
                os.kill(p.info["pid"], signal.SIGKILL)
                return p.info["pid"]
        time.sleep(0.05)
    raise AssertionError(f"no process {match!r} appeared")


def test_ray_worker_killed_mid_unit_is_retried(tmp_path, ray_cluster, serial_table):
    proc = subprocess.Popen([*CLI, *SWEEP, "--executor", "ray", "--address", ray_cluster, "--out", str(tmp_path / "out"),
                             "--cache-dir", str(tmp_path / "cache")], env=_env(), stderr=subprocess.PIPE, text=True)
    # Ray titles a worker process "ray::<task>" while it runs that task: kill one mid-unit
    killed = _kill_first("ray::_ray_run_unit")
    assert proc.wait(600) == 0, proc.stderr.read()
    assert not psutil.pid_exists(killed) or psutil.Process(killed).status() == psutil.STATUS_ZOMBIE
    assert _table(tmp_path / "out") == serial_table
    assert (tmp_path / "out" / "COMPLETE").exists()


def test_process_worker_killed_mid_unit_is_replaced(tmp_path, serial_table):
    proc = subprocess.Popen([*CLI, *SWEEP, "--executor", "processes", "--workers", "2", "--out", str(tmp_path / "out"),
                             "--cache-dir", str(tmp_path / "cache")], env=_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not list((tmp_path / "cache").glob("*.parquet")):  # the workers are mid-sweep
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    children = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    os.kill(children[0].pid, signal.SIGKILL)
    assert proc.wait(600) == 0, proc.stderr.read()
    assert _table(tmp_path / "out") == serial_table


def test_driver_killed_mid_run_resumes_on_rerun(tmp_path, ray_cluster, serial_table):
    cmd = [*SWEEP, "--executor", "ray", "--address", ray_cluster]
    proc = subprocess.Popen([*CLI, *cmd, "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while len(list((tmp_path / "cache").glob("*.parquet"))) < 2:
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = {p.name for p in (tmp_path / "cache").glob("*.parquet")}
    assert not (tmp_path / "out" / "COMPLETE").exists() and len(done_before) < N_UNITS
    rerun = _run(cmd, tmp_path / "out", tmp_path / "cache")  # the same command; the dead run's lock is taken over
    assert rerun.returncode == 0, rerun.stderr
    timings = json.loads((tmp_path / "out" / "config.json").read_text())["timings"]
    cached = {f"{t['kind']}-{t['hash']}.parquet" for t in timings if t["cached"]}
    assert done_before <= cached and len(timings) == N_UNITS  # nothing finished was lost or recomputed
    assert _table(tmp_path / "out") == serial_table and (tmp_path / "out" / "COMPLETE").exists()


def test_process_pool_driver_killed_leaves_no_workers_and_resumes(tmp_path, serial_table):
    cmd = [*SWEEP, "--executor", "processes", "--workers", "2"]
    proc = subprocess.Popen([*CLI, *cmd, "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not list((tmp_path / "cache").glob("*.parquet")):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    workers = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=20)
    for p in alive:  # do not leave them running if the test fails
        p.kill()
    assert not alive, "pool workers outlived the killed driver"
    rerun = _run(cmd, tmp_path / "out", tmp_path / "cache")
    assert rerun.returncode == 0, rerun.stderr
    assert _table(tmp_path / "out") == serial_table
