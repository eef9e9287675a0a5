"""`make setup`'s choice of torch build (docs/install.md, "What `make setup` installs"):
the CPU index on a machine without an NVIDIA GPU when that index answers, pip's own index
otherwise.

``make torch-index`` runs the same shell code as ``setup`` and prints the choice. Each
case runs it with a PATH that holds only what the case needs (a fake ``nvidia-smi`` for
"a GPU is present"), against a local HTTP server standing in for the CPU index.
"""

from __future__ import annotations

import http.server
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
OWN = "pip's own index"

pytestmark = pytest.mark.skipif(MAKE is None, reason="needs make")


@pytest.fixture
def index_url(tmp_path):
    """URL of a local index that answers (it serves a ``torch/`` folder)."""
    (tmp_path / "index" / "torch").mkdir(parents=True)
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "index"))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _choice(tmp_path: Path, *args: str, gpu: bool) -> tuple[str, str]:
    """(stdout, stderr) of ``make -s torch-index ARGS`` with or without an nvidia-smi on PATH."""
    bin_dir = tmp_path / ("gpu-bin" if gpu else "bin")
    bin_dir.mkdir(exist_ok=True)
    if gpu:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\nexit 0\n")
        smi.chmod(0o755)
    out = subprocess.run([MAKE, "-s", "-C", str(ROOT), "torch-index", f"PY={sys.executable}", *args],
                         capture_output=True, text=True, timeout=60, env={"PATH": str(bin_dir)})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip(), out.stderr.strip()


def test_no_gpu_and_a_reachable_cpu_index_takes_the_cpu_build(tmp_path, index_url):
    got, why = _choice(tmp_path, f"CPU_INDEX={index_url}", gpu=False)
    assert got == index_url and "no NVIDIA GPU" in why


def test_a_gpu_takes_pips_own_index(tmp_path, index_url):
    got, why = _choice(tmp_path, f"CPU_INDEX={index_url}", gpu=True)
    assert got == OWN and "NVIDIA GPU found" in why


def test_no_gpu_and_an_unreachable_cpu_index_falls_back_to_pips_own_index(tmp_path):
    got, why = _choice(tmp_path, "CPU_INDEX=http://127.0.0.1:9", gpu=False)  # port 9: nothing listens
    assert got == OWN and "does not answer" in why


def test_an_explicit_index_or_empty_wins(tmp_path, index_url):
    assert _choice(tmp_path, "TORCH_INDEX=https://example.invalid/simple", gpu=True)[0] == "https://example.invalid/simple"
    assert _choice(tmp_path, "TORCH_INDEX=", f"CPU_INDEX={index_url}", gpu=False) == (OWN, "")
