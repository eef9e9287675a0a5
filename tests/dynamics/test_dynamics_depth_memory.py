"""A depth whose weights and records cannot fit is refused before any layer is drawn."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.errors import MemoryLimitError
from tests.cli._harness import run_cli


def test_a_huge_depth_is_refused_before_drawing():
    X = torch.randn(1, 8, 4, dtype=torch.float64)
    t0 = time.perf_counter()
    with pytest.raises(MemoryLimitError, match="100000000 layers"):
        simulate(X, mask="causal", run=RunConfig(depth=10**8))
    assert time.perf_counter() - t0 < 5  # refused from the estimate, not after drawing


def test_the_estimate_follows_the_limit_and_shared_weights():
    X = torch.randn(1, 8, 4, dtype=torch.float64)
    with pytest.raises(MemoryLimitError):
        simulate(X, mask="causal", run=RunConfig(depth=64, max_memory="64KiB"))  # 64 x 4 KiB of records alone
    res = simulate(X, mask="causal", run=RunConfig(depth=64, max_memory="1MiB"))
    assert res.metrics["mu"].shape == (65, 1)


def test_cli_refuses_in_one_line_within_seconds(tmp_path):
    done = run_cli("simulate", "--depth", "100000000", "--n-tokens", "8", "--d-model", "4", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--max-memory" in done.stderr


def test_the_tokens_are_estimated_before_the_run():
    """X(0), the layer's working copies and the recorded states count against the limit:
    here the attention (a 4-key window, blocked) and the weights fit in 16 MiB, the tokens
    (2 x 4096 x 64 float64: 4 MiB each copy, 20 MiB in all for pure SA) do not."""
    from rankcollapse._memory import BLOCK_TOKEN_COPIES, LAYER_TOKEN_COPIES, simulate_tokens_bytes

    X = torch.randn(2, 4096, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cells = 2 * 4096 * 64
    block = LAYER_TOKEN_COPIES + BLOCK_TOKEN_COPIES
    assert simulate_tokens_bytes(2, 4096, 64, 8, pure=True) == cells * 8 * (1 + LAYER_TOKEN_COPIES)
    assert simulate_tokens_bytes(2, 4096, 64, 8) == cells * 8 * (1 + block)
    assert simulate_tokens_bytes(2, 4096, 64, 4, mlp_ratio=4) == cells * (8 + 4 * (block + 8))
    assert simulate_tokens_bytes(2, 4096, 64, 8, depth=3, record_states=True) == cells * 8 * (1 + block + 4)
    with pytest.raises(MemoryLimitError, match=r"^max_memory .*2 x 4096 x 64 tokens.*float64"):
        simulate(X, mask="causal_sliding_window:w=4", run=RunConfig(depth=2, max_memory="16MiB"))
    res = simulate(X[:, :64], mask="causal_sliding_window:w=4", run=RunConfig(depth=2, max_memory="16MiB"))  # the same run, small
    assert res.metrics["mu"].shape == (3, 2)


def test_cli_refuses_a_huge_n_tokens_before_drawing_the_input(tmp_path):
    """``simulate --n-tokens 100000000`` (8 x 1e8 x 64 tokens, ~2 TiB) is refused with the
    memory line, not drawn until the allocator fails."""
    for extra in ([], ["--mask", "complete", "--dtype", "float64"], ["--mask", "causal_sliding_window:w=4"]):
        t0 = time.perf_counter()
        done = run_cli("simulate", "--n-tokens", "100000000", *extra, cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1, done.stderr
        assert "8 x 100000000 x 64 tokens" in done.stderr and "--max-memory" in done.stderr
        assert time.perf_counter() - t0 < 60


_PEAK_CHILD = r"""
import json, sys
import torch
from rankcollapse.dynamics import RunConfig, resolve_variant, simulate

torch.set_num_threads(1)
n, variant = int(sys.argv[1]), resolve_variant("pure", **json.loads(sys.argv[2]))
simulate(torch.randn(1, 256, 64, dtype=torch.float64), "causal_sliding_window:w=4", block=variant,
         run=RunConfig(depth=2, backend="blocked"))  # code paths and lazy imports loaded before the baseline
def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
with open("/proc/self/clear_refs", "w") as f:  # the high-water mark restarts at the resident size
    f.write("5")
base = status("VmRSS")
X = torch.randn(1, n, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
simulate(X, "causal_sliding_window:w=4", block=variant, run=RunConfig(depth=2, backend="blocked"))
print(json.dumps({"base": base, "peak": status("VmHWM")}))
"""


def _measured_peak(n: int, **block) -> int:
    """Bytes the peak RSS of a fresh process (its high-water mark reset through
    /proc/self/clear_refs) rose over its resident size just before ``X(0)`` (1 x n x 64, float64) was drawn and ``simulate`` ran 2 layers of the ``block``
    (overrides of the pure preset) on it."""
    import json

    done = subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(n), json.dumps(block)], capture_output=True,
                          text=True, timeout=300, check=True)
    r = json.loads(done.stdout)
    return r["peak"] - r["base"]


@pytest.mark.slow  # a whole run or fresh processes: CI runs it with the slow tests
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="resets and reads the peak RSS through /proc")
def test_the_token_model_predicts_the_measured_peak():
    """``simulate_tokens_bytes`` against the measured peak RSS: for pure SA (X(0), the layer's input,
    the fused projection, the output: 5 float64 copies of 64 MiB at N = 131,072, d = 64)
    the measured peak is within [0.95, 1.15] of the prediction (the rest: the plan's index
    vectors, the chunks' scores, the allocator); for pre-LN it stays below the estimate."""
    from rankcollapse._memory import simulate_tokens_bytes

    n = 131072
    pure = simulate_tokens_bytes(1, n, 64, 8, depth=2, pure=True)
    assert 0.95 <= _measured_peak(n) / pure <= 1.15
    assert _measured_peak(n, norm="layernorm", placement="pre_ln") <= simulate_tokens_bytes(1, n, 64, 8, depth=2)
