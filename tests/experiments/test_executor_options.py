"""Executor options are refused when they would be ignored, and a Ray ``--address``
nothing answers at is refused in seconds with one line (issue #27). Only loopback
addresses are ever contacted."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.sweep.executors import (
    validate_executor, check_ray_reachable, make_executor, parse_ray_address,
)
from tests.cli._harness import invoke as _invoke

CLI = [sys.executable, "-c", "from rankcollapse.cli import main; main()"]
TINY_PHASE = ["phase", "--axis", "qk_scale=1", "--depth", "2", "--n-tokens", "4", "--d-model", "2", "--n-samples", "1"]


def _refused(code: int, err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("rankcollapse: error:"), (code, err)
    for needle in needles:
        assert needle in lines[0], lines[0]


def _free_loopback_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ API
@pytest.mark.parametrize("kw, message", [
    ({"name": "serial", "workers": 2}, "^workers applies to the processes and ray executors only"),
    ({"name": "serial", "workers": 1}, "^workers applies to the processes and ray executors only"),
    ({"name": "ray", "workers": 2, "address": "auto"}, "^workers sizes a private Ray instance; with a cluster address the cluster's own CPUs"),
    ({"name": "ray", "address": ""}, "address must be auto or host:port"),
    ({"name": "ray", "address": "nonsense"}, "address must be auto or host:port"),
    ({"name": "ray", "address": "127.0.0.1:99999"}, "address must be auto or host:port"),
    ({"name": "ray", "address": "127.0.0.1:"}, "address must be auto or host:port"),
    ({"name": "ray", "address": ":6379"}, "address must be auto or host:port"),
    ({"name": "ray", "address": "a b:6379"}, "address must be auto or host:port"),
    ({"name": "processes", "address": ""}, "^address applies to the ray executor only"),
])
def test_ignored_or_malformed_options_refused(kw, message):
    with pytest.raises(ConfigError, match=message):
        validate_executor(**kw)


@pytest.mark.parametrize("kw", [{"name": "serial"}, {"name": "processes", "workers": 2},
                                {"name": "ray", "workers": 2}, {"name": "ray", "address": "auto"},
                                {"name": "ray", "address": "10.1.2.3:6379"}])
def test_options_that_apply_are_accepted(kw):
    validate_executor(**kw)  # syntax only: nothing is contacted


@pytest.mark.parametrize("address, expected", [
    ("auto", None), ("127.0.0.1:6379", ("127.0.0.1", 6379)), ("[::1]:10001", ("::1", 10001)),
    ("ray://head.local:10001", ("head.local", 10001)),
])
def test_parse_ray_address(address, expected):
    assert parse_ray_address(address) == expected


def test_malformed_address_quotes_a_short_excerpt():
    with pytest.raises(ConfigError) as info:
        parse_ray_address("x" * 5000)
    assert len(str(info.value)) < 200


def test_unreachable_loopback_address_refused_in_seconds():
    address = f"127.0.0.1:{_free_loopback_port()}"
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="cannot reach the Ray cluster"):
        check_ray_reachable(address, timeout=2.0)
    assert time.perf_counter() - t0 < 5.0
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="cannot reach the Ray cluster"):
        make_executor("ray", address=address)  # before ray.init, which retries for minutes
    assert time.perf_counter() - t0 < 10.0


def test_listening_loopback_address_passes_the_connect_check():
    with socket.socket() as server:  # positive control: something answers
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_ray_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout=2.0)


# ------------------------------------------------------------------ CLI
def test_cli_bad_ray_address_one_line_exit_2_in_seconds(tmp_path):
    """A real process for the address nothing answers at, in-process for the malformed one."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}
    for address, needle in ((f"127.0.0.1:{_free_loopback_port()}", "cannot reach the Ray cluster"),
                            ("not an address", "address must be auto or host:port")):
        argv = ["reproduce", "--scale", "smoke", "--executor", "ray", "--address", address,
                "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]
        t0 = time.perf_counter()
        if address == "not an address":
            code, _, err = _invoke(argv, tmp_path)
        else:
            proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, env=env, timeout=90, cwd=tmp_path)
            code, err = proc.returncode, proc.stderr
        wall = time.perf_counter() - t0
        _refused(code, err, needle)
        assert wall < 60, wall  # interpreter start-up on a loaded machine; ray.init alone waits minutes
        assert not (tmp_path / "out").exists()  # refused before --out is created or locked


def test_cli_phase_serial_refuses_workers(tmp_path):
    code, _, err = _invoke([*TINY_PHASE, "--workers", "2", "--out", str(tmp_path / "out")], tmp_path)
    _refused(code, err, "--workers applies to the processes and ray executors only")
    assert not (tmp_path / "out").exists()


def test_cli_phase_fully_cached_still_checks_workers(tmp_path):
    out = tmp_path / "out"
    code, _, err = _invoke([*TINY_PHASE, "--out", str(out)], tmp_path)
    assert code == 0, err
    code, _, err = _invoke([*TINY_PHASE, "--executor", "processes", "--workers", "0", "--out", str(out)], tmp_path)
    _refused(code, err, "--workers must be >= 1")


@pytest.mark.parametrize("argv, needle", [
    (["reproduce", "summary", "DIR", "--workers", "0"], "reproduce summary does not take --workers"),
    (["reproduce", "summary", "DIR", "--executor", "ray"], "reproduce summary does not take --executor"),
    (["reproduce", "audit", "DIR", "--scale", "large"], "reproduce audit does not take --scale"),
    (["reproduce", "schedules", "--workers", "2"], "reproduce schedules does not take --workers"),
    (["reproduce", "schedules", "--format", "json"], "reproduce schedules does not take --format"),
])
def test_cli_reproduce_subcommands_refuse_run_options(tmp_path, argv, needle):
    argv = [str(tmp_path) if a == "DIR" else a for a in argv]
    code, _, err = _invoke(argv, tmp_path)
    _refused(code, err, needle)
    assert not (tmp_path / "runs").exists()  # nothing ran
