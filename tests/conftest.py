"""Shared test settings: offline, deterministic, no display; the number of workers of
``pytest -n auto`` (pytest-xdist)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

from hypothesis import HealthCheck, settings  # noqa: E402

# CI machines are small and shared: no per-example deadline, bounded example counts.
settings.register_profile(
    "ci", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci")


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core this process may run on, at most 8 (each worker
    collects the suite and imports torch once); ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still
    overrides it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, 8))
