"""Long masks never form an N x N matrix; drawing writes an image."""

import tracemalloc

from rankcollapse.masks import analyze, parse_mask
from tests.cli._harness import run_cli


def test_long_window_analysis_stays_far_below_n_squared_memory():
    n = 16384
    for spec, radius in (("sliding_window:w=33", 512), ("causal&sliding_window:w=65", 512)):
        analyze(parse_mask(spec, 64))  # the modules this path imports on first use are not the analysis's memory
        tracemalloc.start()
        a = analyze(parse_mask(spec, n))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert a.radius == radius
        assert peak < n * n / 8, (spec, peak)  # N^2 bytes would be 256 MiB


def test_show_writes_png(tmp_path):
    out = tmp_path / "m"
    res = run_cli("mask", "show", "longformer:w=5,globals=0+7", "--n-tokens", "24", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert (out / "mask.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
