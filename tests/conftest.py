"""Shared test settings: offline, deterministic, no display."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
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
