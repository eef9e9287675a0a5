"""Shared test settings: offline, deterministic, no display; the number of workers of
``pytest -n auto`` (pytest-xdist)."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# Each pytest-xdist worker gets its share of the cores as intra-op threads (at least one):
# two workers with two OpenMP threads each on two cores spin at every barrier, which cost
# more CPU than the tests themselves. Results do not depend on it (tests compare with
# tolerances that hold at any thread count); OMP_NUM_THREADS set by the caller wins.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
# converted GGUF weights go to a folder of this session, never the user's cache
if "RANKCOLLAPSE_GGUF_CACHE" not in os.environ:
    os.environ["RANKCOLLAPSE_GGUF_CACHE"] = tempfile.mkdtemp(prefix="rankcollapse-gguf-")
    atexit.register(shutil.rmtree, os.environ["RANKCOLLAPSE_GGUF_CACHE"], ignore_errors=True)

from hypothesis import HealthCheck, settings  # noqa: E402

# CI machines are small and shared: no per-example deadline, bounded example counts.
settings.register_profile(
    "ci", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci")


def pytest_collection_finish(session):
    """A session that runs slow tests reads each packaged model from disk once."""
    if any(item.get_closest_marker("slow") for item in session.items):
        _load_packaged_models_once()


def _load_packaged_models_once() -> None:
    """The packaged models (MiniLM; SmolLM2, ~60 CPU-s to de-quantise its GGUF file) are
    read from disk once in this process: a later load gets a deep copy of the weights
    read, and runs every check ``load_model`` makes after reading them. Other sources (a
    folder a test wrote, a hub name) load as usual; a test may still replace
    ``_from_pretrained`` with its own."""
    import copy

    from rankcollapse.errors import RankCollapseError
    from rankcollapse.models import loading, source

    packaged = set()
    for name in ("minilm", "smollm2"):
        try:
            packaged.add(source._source(name, None)[:2])
        except RankCollapseError:  # not installed: its tests skip
            pass
    read, weights = loading._from_pretrained, {}

    def from_pretrained(source, gguf_file, *args):
        if (source, gguf_file) not in packaged:
            return read(source, gguf_file, *args)
        key = (source, gguf_file, *args)
        if key not in weights:
            weights[key] = read(source, gguf_file, *args)
        return copy.deepcopy(weights[key])

    loading._from_pretrained = from_pretrained


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core this process may run on, at most 8 (each worker
    collects the suite and imports torch once); ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still
    overrides it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, 8))
