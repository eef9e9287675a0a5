"""Where units run: in this process, in local worker processes, or on a Ray cluster
(docs/sweeps.md, "Executors"). Every unit runs on :data:`UNIT_THREADS` intra-op threads, so
results are identical to the last digit under every executor; ``map`` yields :class:`Done`
records as units finish, in any order.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import socket
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import pandas as pd

from .._io import config_hash
from ..errors import ConfigError, excerpt
from .context import RunContext
from .units import Shard, Unit, UnitFn

UNIT_THREADS = 1  # intra-op torch threads of every unit, under every executor
EXECUTOR_NAMES = ("serial", "processes", "ray")
RAY_CONNECT_TIMEOUT_S = 3.0  # for a TCP connection to a Ray --address (ray.init retries for minutes)
RETRIES = 3  # resubmissions of a unit whose worker died (Ray max_retries; process pool rebuilds)


@dataclass
class Done:
    """One finished unit: its index in the submitted list, frame, worker-side seconds, worker."""

    index: int
    frame: pd.DataFrame
    wall: float
    cpu: float
    worker: str


def run_unit(unit: Unit, ctx: RunContext, table: Mapping[str, UnitFn]) -> tuple[pd.DataFrame, float, float, str]:
    """``table[unit.kind](unit, ctx)`` on :data:`UNIT_THREADS` threads:
    ``(frame, wall seconds, CPU seconds of this process, worker name)``."""
    import torch

    t0, c0 = time.perf_counter(), time.process_time()
    old = torch.get_num_threads()
    torch.set_num_threads(UNIT_THREADS)
    try:
        frame = table[unit.kind](unit, ctx)
    finally:
        torch.set_num_threads(old)
    return frame, time.perf_counter() - t0, time.process_time() - c0, f"{socket.gethostname()}:{os.getpid()}"


class SerialExecutor:
    """Units one after another in this process, sharing the caller's run context."""

    name = "serial"
    workers = 1

    def map(self, units: list[Unit], ctx: RunContext, table: Mapping[str, UnitFn]) -> Iterator[Done]:
        for i, u in enumerate(units):
            yield Done(i, *run_unit(u, ctx, table))

    def close(self) -> None:
        pass


# --- worker processes -------------------------------------------------------------------
_WORKER: dict[str, Any] = {}  # the worker's run context: the only module state, in the workers


def _init_worker(data: dict[str, Any], device: str, parent: int | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _WORKER["ctx"] = RunContext(data, device)
    if parent is not None:  # end this worker when the driver dies (kill -9 included)
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker_run(unit: Unit, table: Mapping[str, UnitFn]) -> tuple[pd.DataFrame, float, float, str]:
    return run_unit(unit, _WORKER["ctx"], table)


class ProcessExecutor:
    """Units in ``workers`` local ``spawn`` processes; a pool whose worker dies is rebuilt and
    the unfinished units resubmitted, at most :data:`RETRIES` times."""

    name = "processes"

    def __init__(self, workers: int, data: dict[str, Any], device: str) -> None:
        self.workers, self._data, self._device = int(workers), data, str(device)
        self._pool: ProcessPoolExecutor | None = None

    def map(self, units: list[Unit], ctx: RunContext, table: Mapping[str, UnitFn]) -> Iterator[Done]:
        pending = dict(enumerate(units))
        for attempt in range(RETRIES + 1):
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                                 initializer=_init_worker, initargs=(self._data, self._device, os.getpid()))
            pool = self._pool
            table = dict(table)  # module-level functions: pickled by reference
            futures: dict[Future, int] = {pool.submit(_worker_run, u, table): i for i, u in pending.items()}
            try:
                while futures:
                    finished, _ = wait(futures, return_when=FIRST_COMPLETED)
                    for f in finished:
                        i = futures.pop(f)
                        done = Done(i, *f.result())
                        del pending[i]
                        yield done
                return
            except BrokenProcessPool:
                self.close()  # a worker died: rebuild the pool, resubmit what is left
                if attempt == RETRIES:
                    raise
            except BaseException:
                for f in futures:
                    f.cancel()
                self.close()
                raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


# --- Ray --------------------------------------------------------------------------------
def _ray_run_unit(unit: Unit, data: dict[str, Any], device: str, table: Mapping[str, UnitFn]
                  ) -> tuple[pd.DataFrame, float, float, str]:
    """The Ray task; a reused Ray worker keeps one run context per data spec between tasks."""
    key = config_hash([data, device])
    if _WORKER.get("key") != key:
        _init_worker(data, device)
        _WORKER["key"] = key
    return run_unit(unit, _WORKER["ctx"], table)


class RayExecutor:
    """Units as Ray tasks (one CPU each) on the cluster at ``address`` (``auto``: started on
    this machine), or a private local instance of ``workers`` CPUs when ``address`` is None. Raises
    ``ConfigError``: Ray is not installed or the cluster cannot be reached."""

    name = "ray"

    def __init__(self, address: str | None, workers: int | None, data: dict[str, Any], device: str) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("executor 'ray' needs Ray: pip install 'rankcollapse[distributed]'") from None
        self._data, self._device, self._own = data, str(device), not ray.is_initialized()
        if self._own:
            if address:
                check_ray_reachable(address)  # seconds, instead of ray.init's minutes of retries
            where = {"address": address} if address else {"num_cpus": workers or os.cpu_count()}
            try:
                ray.init(**where, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
            except ConnectionError as exc:
                raise ConfigError(f"cannot reach the Ray cluster at {excerpt(address)}: {exc}") from None
        self.workers = int(ray.cluster_resources().get("CPU", 1))
        self._task = ray.remote(num_cpus=1, max_retries=RETRIES, retry_exceptions=False)(_ray_run_unit)

    def map(self, units: list[Unit], ctx: RunContext, table: Mapping[str, UnitFn]) -> Iterator[Done]:
        import ray

        table = dict(table)
        refs = {self._task.remote(u, self._data, self._device, table): i for i, u in enumerate(units)}
        try:
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1)
                for ref in ready:
                    yield Done(refs.pop(ref), *ray.get(ref))
        except BaseException:
            for ref in refs:
                ray.cancel(ref, force=True)
            raise

    def close(self) -> None:
        if self._own:
            import ray

            ray.shutdown()


def parse_ray_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray ``--address`` (``host:port``, ``[v6]:port`` or
    ``ray://host:port``), or None for ``auto``. Raises ``ConfigError``: anything else (an empty
    host, a missing or bad port, spaces)."""
    if address == "auto":
        return None
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    ok = (sep and host and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
          and not any(c.isspace() or c in "/@[]" for c in host))
    if not ok:
        raise ConfigError(f"address must be auto or host:port (port 1-65535), got {excerpt(address)}")
    return host, int(port)


def check_ray_reachable(address: str, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Refuse a Ray ``address`` nothing answers at within ``timeout`` seconds (``auto`` is left to
    Ray). Raises ``ConfigError``: bad syntax, an unknown host, or no answer in time."""
    target = parse_ray_address(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout):
            pass
    except OSError as exc:  # refused, unreachable, unknown host, timed out
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        raise ConfigError(f"cannot reach the Ray cluster at {excerpt(address)} within {timeout:g} s: {why}") from None


def validate_executor(name: str, *, workers: int | None = None, address: str | None = None) -> None:
    """Validate executor options without starting anything or touching the network. Raises
    ``ConfigError``: unknown name, ``workers`` < 1, an option the executor would ignore (``workers``
    with ``serial`` or a Ray ``address``, ``address`` without ``ray``), a malformed ``address``, Ray
    not installed; each names its argument."""
    if name not in EXECUTOR_NAMES:
        raise ConfigError(f"{name!r} is unknown; choose one of {', '.join(EXECUTOR_NAMES)}", argument="executor")
    if workers is not None and int(workers) < 1:
        raise ConfigError(f"must be >= 1, got {workers}", argument="workers")
    if address is not None and name != "ray":
        raise ConfigError(f"applies to the ray executor only, not {name!r}", argument="address")
    if workers is not None and name == "serial":
        raise ConfigError("applies to the processes and ray executors only (serial runs one unit at a time)",
                          argument="workers")
    if workers is not None and address is not None:
        raise ConfigError("sizes a private Ray instance; with a cluster address the cluster's own CPUs are used",
                          argument="workers")
    if address is not None:
        parse_ray_address(address)
    if name == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("'ray' needs Ray: pip install 'rankcollapse[distributed]'", argument="executor")


@dataclass(frozen=True)
class ExecutionConfig:
    """Where and how a run computes its units; the numbers do not depend on it.

    Attributes
    ----------
    executor : "serial" | "processes" | "ray".
    workers : worker processes (``processes``; default every core) or CPUs of a private Ray.
    address : Ray cluster address (``auto``, ``host:port``); only with ``ray``.
    device : torch device of the simulated units.
    progress : report progress on stderr.
    shard : compute only shard ``I/K`` of the run's units (:class:`~.units.Shard`); None: all.

    Raises ``ConfigError``: bad executor options or shard spec (naming the argument).
    """

    executor: str = "serial"
    workers: int | None = None
    address: str | None = None
    device: str = "cpu"
    progress: bool = True
    shard: Shard | str | None = None

    def __post_init__(self) -> None:
        validate_executor(self.executor, workers=self.workers, address=self.address)
        if self.shard is not None:
            object.__setattr__(self, "shard", Shard.parse(self.shard))


def make_executor(name: str, *, workers: int | None = None, address: str | None = None,
                  data: dict[str, Any] | None = None, device: str = "cpu"):
    """The executor ``name`` with ``workers`` and ``address`` as in :class:`ExecutionConfig`;
    workers build their run context from the data spec ``data``. Raises ``ConfigError``: what
    :func:`validate_executor` refuses."""
    validate_executor(name, workers=workers, address=address)
    if name == "serial":
        return SerialExecutor()
    if name == "processes":
        return ProcessExecutor(workers or os.cpu_count() or 1, data or {}, device)
    return RayExecutor(address, workers, data or {}, device)
