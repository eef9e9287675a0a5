"""Shared fixtures of the experiments tests: a synthetic executor in place of the real
simulations, probes and theory checks."""

import dataclasses
import pickle

import numpy as np
import pytest
from filelock import FileLock

from rankcollapse.experiments import ExecutionConfig, StorageConfig, runner
from rankcollapse.experiments.table import rows_from_metrics
from rankcollapse.experiments.units import _labels
from rankcollapse.sweep import units as sweep_units

METRICS = ("mu", "mu_relative", "avg_abs_cos", "rank_fraction", "sigma_min", "measured_rate", "n_equilibria",
           "expected_min", "basin_ci_low")


class FakeExecutor:
    """Deterministic rows: metric value exp(-rate * layer), rate from the unit hash."""

    def __init__(self, fail_after: int | None = None):
        self.calls = 0
        self.fail_after = fail_after

    def __call__(self, unit, ctx):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt
        self.calls += 1
        depth = int(unit.params.get("depth", 6))
        rate = int(unit.hash[:4], 16) / 65535.0
        vals = np.exp(-rate * np.arange(depth + 1))[:, None] * np.ones((1, 2))
        return rows_from_metrics({m: vals for m in METRICS}, _labels(unit))


def _use(monkeypatch, kind, fn):
    # the kind's version and label, hence the unit keys, are kept
    monkeypatch.setitem(sweep_units._KINDS, kind, dataclasses.replace(sweep_units.unit_kind(kind), run=fn))


def _use_everywhere(monkeypatch, ex):
    for kind in sweep_units.unit_kinds("experiments"):
        _use(monkeypatch, kind, ex)
    monkeypatch.setattr(runner, "_preflight", lambda ctx, units: None)


@pytest.fixture
def use_function(monkeypatch):
    """``use_function(kind, fn)`` makes ``fn`` the registered function of unit kind
    ``kind`` for one test."""
    return lambda kind, fn: _use(monkeypatch, kind, fn)


@pytest.fixture
def fake_executor_cls():
    """The synthetic executor class, for tests that need their own instances."""
    return FakeExecutor


@pytest.fixture
def install_executor(monkeypatch):
    """``install_executor(ex)`` makes ``ex`` run every unit kind (and skips pre-flight)."""

    def install(ex):
        _use_everywhere(monkeypatch, ex)
        return ex

    return install


@pytest.fixture
def fake(monkeypatch):
    ex = FakeExecutor()
    _use_everywhere(monkeypatch, ex)
    return ex


@pytest.fixture(scope="session")
def all_smoke(tmp_path_factory, worker_id):
    """The :class:`RunResult` of ``run_experiment("all", "smoke")`` with the synthetic
    executor, written to its ``out`` once per session: the tests that only read the whole
    run share it. Read it, never write into its folder."""
    return _once_per_session(tmp_path_factory, worker_id, "all_smoke", lambda folder: _run_all(folder / "run"))


@pytest.fixture(scope="module")
def fig2_nearby(tmp_path_factory):
    """The :class:`RunResult` of ``run_experiment("fig2", "smoke")`` with its nearby
    settings, synthetic executor (probe rows labelled like the real executor's), kept in
    memory: built once for the tests of one file that only read it."""
    ex = FakeExecutor()

    def probe(unit, ctx):
        variant = "drop_norm" if unit.params.get("drop") else "full"
        return ex(unit, ctx).assign(variant=variant, mask="complete")

    with pytest.MonkeyPatch.context() as mp:
        _use_everywhere(mp, ex)
        _use(mp, "probe", probe)
        return runner.run_experiment("fig2", "smoke", tmp_path_factory.mktemp("fig2") / "run",
                                     execution=ExecutionConfig(progress=False), storage=StorageConfig(write=False))


@pytest.fixture(scope="session")
def fig3_seed3(tmp_path_factory, worker_id):
    """``(RunResult, units computed)`` of ``run_experiment("fig3", "smoke", seed=3)``
    without nearby settings, synthetic executor, written to its ``out`` once per session.
    Read it, never write into its ``out``; runs written beside ``out`` share its unit cache."""
    def build(folder):
        ex = FakeExecutor()
        res = _run_fake("fig3", folder / "run", ex, seed=3, nearby=False)
        return res, ex.calls

    return _once_per_session(tmp_path_factory, worker_id, "fig3_seed3", build)


def _once_per_session(tmp_path_factory, worker_id, name, build):
    """``build(folder)`` once per session: under pytest-xdist the workers share one folder
    of this session and the first one builds it (the result is pickled beside it)."""
    if worker_id == "master":
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / name  # this session's folder, above every worker's
    saved = shared.with_suffix(".pickle")
    with FileLock(str(saved) + ".lock"):
        if not saved.is_file():
            shared.mkdir()
            saved.write_bytes(pickle.dumps(build(shared)))
        return pickle.loads(saved.read_bytes())


def _run_all(out):
    return _run_fake("all", out, nearby=False)


def _run_fake(name, out, executor=None, **kwargs):
    with pytest.MonkeyPatch.context() as mp:
        _use_everywhere(mp, executor or FakeExecutor())
        return runner.run_experiment(name, "smoke", out, execution=ExecutionConfig(progress=False), **kwargs)
