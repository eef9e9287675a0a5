"""A depth whose weights and records cannot fit is refused before any layer is drawn."""

from __future__ import annotations

import time

import pytest
import torch

from rankcollapse.dynamics import simulate
from rankcollapse.errors import MemoryLimitError
from tests.cli._harness import run_cli


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
    done = run_cli("simulate", "--depth", "100000000", "--n-tokens", "8", "--d-model", "4", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--max-memory" in done.stderr


def test_the_tokens_are_estimated_before_the_run():
    """X(0), the layer's working copies and the recorded states count against the limit:
    here the attention (a 4-key window, blocked) and the weights fit in 16 MiB, the tokens
    (2 x 4096 x 64 float64: 4 MiB each copy, 44 MiB in all) do not."""
    from rankcollapse._memory import LAYER_TOKEN_COPIES, simulate_tokens_bytes

    X = torch.randn(2, 4096, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cells = 2 * 4096 * 64
    assert simulate_tokens_bytes(2, 4096, 64, 8) == cells * 8 * (1 + LAYER_TOKEN_COPIES)
    assert simulate_tokens_bytes(2, 4096, 64, 4, mlp_ratio=4) == cells * (8 + 4 * (LAYER_TOKEN_COPIES + 8))
    assert simulate_tokens_bytes(2, 4096, 64, 8, depth=3, record_states=True) == cells * 8 * (1 + LAYER_TOKEN_COPIES + 4)
    with pytest.raises(MemoryLimitError, match=r"^max_memory .*2 x 4096 x 64 tokens.*float64"):
        simulate(X, mask="causal_sliding_window:w=4", depth=2, max_memory="16MiB")
    res = simulate(X[:, :64], mask="causal_sliding_window:w=4", depth=2, max_memory="16MiB")  # the same run, small
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
