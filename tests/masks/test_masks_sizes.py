"""Schedules and masks are sized before they are expanded or allocated, and every
malformed schedule is a typed one-line refusal."""

import time

import numpy as np
import pytest

from rankcollapse import masks
from rankcollapse.errors import MaskError, MemoryLimitError, RankCollapseError
from tests.cli._harness import run_cli


def _timed_cli(*args, cwd=None):
    """(exit status, stderr lines, seconds) of the CLI."""
    t0 = time.perf_counter()
    res = run_cli(*args, cwd=cwd)
    return res.returncode, res.stderr.strip().splitlines(), time.perf_counter() - t0


def assert_refused(args, match, cwd=None):
    rc, lines, seconds = _timed_cli(*args, cwd=cwd)
    assert rc == 2, lines
    assert len(lines) == 1 and lines[0].startswith("rankcollapse: error:"), lines
    assert match in lines[0], lines
    assert seconds < 30


# --- repeat counts and periods: counted before any layer list is built -------------------

@pytest.mark.parametrize("spec", ["schedule:causal*100000000", "schedule:causal*" + "9" * 5000,
                                  "schedule:causal*4096,complete"])
def test_long_period_refused_before_expansion(spec):
    t0 = time.perf_counter()
    with pytest.raises(MaskError, match="period"):
        masks.parse_schedule(spec, 8)
    assert time.perf_counter() - t0 < 2.0


def test_longest_period_accepted():
    from rankcollapse.masks.schedule import MAX_PERIOD

    assert MAX_PERIOD == 4096  # the limit docs/schedules.md states
    s = masks.parse_schedule(f"schedule:causal*{MAX_PERIOD - 1},complete", 4)
    assert s.period == MAX_PERIOD and s.layer(MAX_PERIOD - 1).spec == "complete"


def test_yaml_repeat_refused_before_expansion(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("- mask: causal\n  repeat: 100000000\n- complete\n")
    with pytest.raises(MaskError, match="longest period"):
        masks.parse_schedule(f"schedule:{f}", 8)
    f.write_text("- mask: causal\n  repeat: 3\n- complete\n")
    assert masks.parse_schedule(f"schedule:{f}", 8).period == 4


def test_cli_long_period_one_line(tmp_path):
    assert_refused(["mask", "describe", "schedule:causal*100000000", "--n-tokens", "8"], "longest period")
    f = tmp_path / "s.yaml"
    f.write_text("- mask: causal\n  repeat: 100000000\n")
    assert_refused(["mask", "describe", f"schedule:{f}", "--n-tokens", "8"], "longest period")


# --- a layer on other tokens ---------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda m: m, lambda m: [m], lambda m: [m, masks.parse_mask("causal", 8)]])
def test_layer_of_other_n_refused(make):
    with pytest.raises(MaskError, match="N=4"):
        masks.parse_schedule(make(masks.parse_mask("causal", 4)), 8)


def test_npy_file_layer_of_other_n_refused(tmp_path):
    f = tmp_path / "m4.npy"
    np.save(f, np.tril(np.ones((4, 4), dtype=bool)))
    for src in (f"schedule:file:{f}*2,causal", [f"file:{f}", "causal"]):
        with pytest.raises(MaskError, match="N=4"):
            masks.parse_schedule(src, 8)
    assert masks.parse_schedule(f"schedule:file:{f}*2,causal", 4).period == 3


# --- files and sources that are no schedule ------------------------------------------------

def test_non_utf8_schedule_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_bytes(b"- caus\xe9al\n")  # Latin-1
    with pytest.raises(MaskError, match="not valid UTF-8"):
        masks.parse_schedule(f"schedule:{f}", 8)
    assert_refused(["mask", "describe", f"schedule:{f}", "--n-tokens", "8"], "not valid UTF-8")


@pytest.mark.parametrize("source", [None, 5, 2.5, object()])
def test_non_schedule_source_typed(source):
    with pytest.raises(MaskError, match="a schedule is"):
        masks.parse_schedule(source, 8)


def test_yaml_error_is_one_line():
    with pytest.raises(MaskError) as info:
        masks.parse_schedule("schedule:[causal]*2", 8)
    assert "\n" not in str(info.value) and "line 1" in str(info.value)


# --- dense masks sized before their edges are allocated ------------------------------------

@pytest.mark.parametrize("spec", ["random:p=0.5", "strided:stride=1", "fixed:stride=2", "complete|causal",
                                  "bigbird:w=3,random=400"])
def test_dense_mask_at_large_n_refused_before_allocation(spec):
    t0 = time.perf_counter()
    with pytest.raises(MemoryLimitError, match="edges needs about"):
        masks.parse_mask(spec, 100_000).to_csr()
    assert time.perf_counter() - t0 < 10.0


def test_cli_dense_mask_at_large_n_one_line():
    assert_refused(["mask", "describe", "fixed:stride=2", "--n-tokens", "100000"], "edges needs about")


def test_edge_guard_counts_exactly():
    from rankcollapse.masks._build import COO_BYTES_PER_EDGE, check_edges

    # 2,500 edges at 48 bytes = 120 kB: within any machine's limit; the 10^12-edge case is not
    check_edges(2_500, 50, COO_BYTES_PER_EDGE)
    with pytest.raises(MemoryLimitError, match="1,000,000,000,000 edges"):
        check_edges(10**12, 10**6, COO_BYTES_PER_EDGE)
    assert issubclass(MemoryLimitError, RankCollapseError)


def _longformer_reference(n, h, g):
    i, j = np.ogrid[:n, :n]
    return (np.abs(i - j) <= h) | (j == g) | (i == g)


def test_sparse_patterns_at_large_n_still_built():
    # window w = 5 plus global token 0 has 7N - 12 edges (5N - 6 window, N - 3 per global side)
    assert _longformer_reference(50, 2, 0).sum() == 7 * 50 - 12
    assert masks.parse_mask("longformer:w=5,globals=0", 50).to_csr().nnz == 7 * 50 - 12
    assert masks.parse_mask("longformer:w=5,globals=0", 100_000).to_csr().nnz == 7 * 100_000 - 12


def _alias_levels(prefix):
    """YAML items whose anchors nest 10 x per level: str() of level 8 holds 10^9 leaves."""
    text = f"{prefix}&a0 [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 9):
        text += f"{prefix}&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n"
    return text


@pytest.mark.parametrize("prefix, match", [("- mask: ", "mask spec string"),
                                           ("- mask: causal\n  repeat: ", "repeat count must be"),
                                           ("- mask: causal\n  note: ", "keys 'mask' and 'repeat'")])
def test_yaml_alias_structures_refused_without_expanding(tmp_path, prefix, match):
    f = tmp_path / "bomb.yaml"
    f.write_text(_alias_levels(prefix))
    t0 = time.perf_counter()
    with pytest.raises(MaskError, match=match):
        masks.parse_schedule(f"schedule:{f}", 8)
    assert time.perf_counter() - t0 < 5.0


@pytest.mark.parametrize("item, match", [({"repeat": 2}, "mask spec string"), ({"mask": "causal", "repeat": 0}, ">= 1"),
                                         ({"mask": "causal", "repeat": "10^8"}, ">= 1"),
                                         ({"mask": "causal", "repeat": 2.5}, ">= 1")])
def test_dict_items_checked(item, match):
    with pytest.raises(MaskError, match=match):
        masks.parse_schedule([item], 8)
