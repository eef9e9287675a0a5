"""Influence profiles are sized before any work (``_memory.influence_bytes``): a huge N, a
huge depth, ``query="all"`` at large N or a dense CSR mask is refused with the memory
line (``MemoryLimitError`` in the API, one line and exit 2 on the command line)."""

import sys
import time

import pytest
from typer.testing import CliRunner

from rankcollapse._memory import (INFLUENCE_BYTES_PER_EDGE, INFLUENCE_BYTES_PER_LAYER, INFLUENCE_BYTES_PER_TOKEN,
                                  influence_bytes)
from rankcollapse.cli import run
from rankcollapse.errors import MaskError, MemoryLimitError
from rankcollapse.masks import influence, parse_mask


def test_the_estimate_is_its_closed_form():
    n, h = 1000, 3
    base = 8 * h * n + INFLUENCE_BYTES_PER_TOKEN * n + INFLUENCE_BYTES_PER_LAYER * h
    assert influence_bytes(n, h) == base
    assert influence_bytes(n, h, n_edges=7000) == base + INFLUENCE_BYTES_PER_EDGE * 7000
    assert influence_bytes(n, h, n_masks=2, query_all=True) == base + 8 * n * n * 5  # 2 dense masks, product, 2 temps
    assert influence_bytes(n, h, as_json=True) > base


@pytest.mark.parametrize("n, depth", [(10**6, 10**4), (10**9, 12), (1000, 10**9)])
def test_huge_sizes_are_refused_at_once(n, depth):
    t0 = time.perf_counter()
    with pytest.raises(MemoryLimitError, match=rf"^max_memory .*N = {n}, depth {depth} needs about"):
        influence("causal", n, depth=depth, alpha=0.5, max_memory="8GiB")
    assert time.perf_counter() - t0 < 5  # from the estimate, before the mask or any profile


def test_the_limit_is_the_callers_and_a_fitting_request_runs():
    need = influence_bytes(1000, 3)
    with pytest.raises(MemoryLimitError):
        influence("causal", 1000, depth=3, alpha=0.5, max_memory=need - 1)
    assert influence("causal", 1000, depth=3, alpha=0.5, max_memory=need).influence.shape == (1000,)


def test_csr_edges_count_once_the_mask_is_known():
    """A CSR-path mask is refused by its edges (second check), an interval mask of the same
    N and depth is not: the first check alone passes both."""
    spec, n = "bigbird:w=3,globals=0,random=2,seed=0", 20_000
    edges = parse_mask(spec, n).n_edges
    limit = influence_bytes(n, 2) + INFLUENCE_BYTES_PER_EDGE * edges // 2
    with pytest.raises(MemoryLimitError, match="N = 20000, depth 2"):
        influence(spec, n, depth=2, alpha=0.5, max_memory=limit)
    assert influence("sliding_window:w=3", n, depth=2, alpha=0.5, max_memory=limit).method == "intervals"


def test_query_all_at_large_n_is_the_memory_line():
    with pytest.raises(MemoryLimitError, match=r"N = 100000, depth 2 \(query all\)"):
        influence("causal", 100_000, depth=2, alpha=0.0, query="all", max_memory="8GiB")
    with pytest.raises(MaskError, match="at most N"):  # small enough to fit, above the output cap
        influence("causal", 2000, depth=2, alpha=0.0, query="all", max_memory="8GiB")


def _cli(*argv):
    with CliRunner().isolation() as streams:
        code = run(list(argv))
        sys.stdout.flush()
        sys.stderr.flush()
        return code, streams[0].getvalue().decode(), streams[1].getvalue().decode()


@pytest.mark.parametrize("argv", [
    ["--n-tokens", "1000000000", "--depth", "12"],
    ["--n-tokens", "1000", "--depth", "1000000000"],
    ["--n-tokens", "100000", "--depth", "2", "--query", "all", "--format", "json"],
    ["--n-tokens", "1000", "--depth", "3", "--format", "json"],
])
def test_cli_refuses_in_one_line(argv):
    code, out, err = _cli("mask", "influence", "causal", *argv, "--alpha", "0.5", "--max-memory", "200kB")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "needs about" in err and "--max-memory" in err
