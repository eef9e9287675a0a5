"""A depth whose weights and records cannot fit is refused before any layer is drawn."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from rankcollapse.dynamics import simulate
from rankcollapse.errors import MemoryLimitError


def test_a_huge_depth_is_refused_before_drawing():
    X = torch.randn(1, 8, 4, dtype=torch.float64)
    t0 = time.perf_counter()
    with pytest.raises(MemoryLimitError, match="100000000 layers"):
        simulate(X, mask="causal", depth=10**8)
    assert time.perf_counter() - t0 < 5  # refused from the estimate, not after drawing


def test_the_estimate_follows_the_limit_and_shared_weights():
    X = torch.randn(1, 8, 4, dtype=torch.float64)
    with pytest.raises(MemoryLimitError):
        simulate(X, mask="causal", depth=64, max_memory="64KiB")  # 64 x 4 KiB of records alone
    res = simulate(X, mask="causal", depth=64, max_memory="1MiB")
    assert res.metrics["mu"].shape == (65, 1)


def test_cli_refuses_in_one_line_within_seconds(tmp_path):
    cmd = [sys.executable, "-c", "from rankcollapse.cli import main; main()", "simulate", "--depth", "100000000",
           "--n-tokens", "8", "--d-model", "4"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--max-memory" in done.stderr
