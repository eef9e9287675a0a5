"""Bad input: one clear MaskError naming the problem; exit status 2 at the CLI."""

import numpy as np
import pytest

from rankcollapse.errors import MaskError
from rankcollapse.masks import Mask, parse_mask
from tests.cli._harness import run_cli

BAD_SPECS = [
    ("nosuch", 8, "unknown mask 'nosuch'"),
    ("sliding_window:w=4", 8, "must be odd"),
    ("sliding_window:x=3", 8, "has no key 'x'"),
    ("sliding_window", 8, "needs key 'w'"),
    ("sliding_window:w=abc", 8, "must be an integer"),
    ("sliding_window:w=3,w=5", 8, "mask 'sliding_window:w=3,w=5': key 'w' given twice"),
    ("random:p=nan", 8, "mask 'random:p=nan': key 'p' must be a finite number, got 'nan'"),
    ("causal:w=3", 8, "mask 'causal:w=3': 'causal' has no key 'w'; it takes no parameters"),
    ("causal_sliding_window:w=0", 8, "must be an integer >= 1"),
    ("prefix:k=9", 8, "exceeds the number of tokens"),
    ("documents:lengths=3+4", 8, "sum to 7, not N=8"),
    ("documents:lengths=8+0", 8, "document length must be an integer >= 1"),
    ("longformer:w=3,globals=0+8", 8, "global token 8 is outside 0..7"),
    ("fixed:stride=2,c=3", 8, "must be <= stride"),
    ("random:p=1.5", 8, "p must be in [0, 1]"),
    ("block:size=-2", 8, "block size must be an integer >= 1"),
    ("dilated:w=3,dilation=2,causal=maybe", 8, "true or false"),
    ("causal&", 8, "empty mask spec"),
    ("causal", 0, "n_tokens must be an integer >= 1"),
    ("file:/nonexistent/m.npy", 8, "does not exist"),
]


@pytest.mark.parametrize(("spec", "n", "message"), BAD_SPECS)
def test_bad_spec_raises_mask_error(spec, n, message):
    with pytest.raises(MaskError) as info:
        parse_mask(spec, n)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_bad_files(tmp_path):
    np.save(tmp_path / "rect.npy", np.ones((3, 4), dtype=bool))
    np.save(tmp_path / "float.npy", np.ones((3, 3)))
    np.save(tmp_path / "empty_row.npy", np.array([[1, 0], [0, 0]], dtype=bool))
    (tmp_path / "far.txt").write_text("0 0\n1 1\n2 5\n")
    (tmp_path / "junk.txt").write_text("0 0\n1 x\n")
    cases = [("rect.npy", 3, "square"), ("float.npy", 3, "boolean"), ("empty_row.npy", 2, "rows [1]"),
             ("far.txt", 3, "line 3: edge '2 5' names a token outside 0..2"), ("junk.txt", 2, "line 2"),
             ("rect.npy", 4, "square")]
    (tmp_path / "swap.txt").write_text("0 1\n1 0\n")
    with pytest.raises(MaskError, match=r"rows \[0\] allow no key"):
        parse_mask(f"file:{tmp_path / 'swap.txt'}&causal", 2)
    for name, n, message in cases:
        with pytest.raises(MaskError) as info:
            parse_mask(f"file:{tmp_path / name}", n)
        assert message in str(info.value), str(info.value)


def test_a_npy_mask_of_0_1_integers_reads_as_its_boolean_form(tmp_path):
    """A ``.npy`` mask holds booleans or 0/1 integers, as every other mask matrix may; other
    integers are refused."""
    causal = np.tril(np.ones((5, 5), dtype=bool))
    np.save(tmp_path / "ints.npy", causal.astype(np.int64))
    np.save(tmp_path / "twos.npy", 2 * causal.astype(np.int8))
    assert parse_mask(f"file:{tmp_path / 'ints.npy'}", 5) == parse_mask("causal", 5)
    with pytest.raises(MaskError, match="boolean \\(or 0/1 integers\\), got dtype int8"):
        parse_mask(f"file:{tmp_path / 'twos.npy'}", 5)


def test_bad_matrices():
    with pytest.raises(MaskError, match="square"):
        Mask.from_dense(np.ones((2, 3), dtype=bool))
    with pytest.raises(MaskError, match="boolean"):
        Mask.from_dense(np.full((2, 2), 0.5))
    with pytest.raises(MaskError, match=r"rows \[0\]"):
        Mask.from_dense(np.array([[False, False], [True, True]]))
    with pytest.raises(MaskError, match="cannot combine"):
        parse_mask("causal", 3) & parse_mask("causal", 4)


@pytest.mark.parametrize("args", [
    ["mask", "describe", "sliding_window:w=4", "--n-tokens", "9", "--format", "json"],
    ["mask", "describe", "causal", "--n-tokens", "0"],
    ["mask", "compare", "causal", "nosuch", "--n-tokens", "5"],
    ["mask", "compare", "causal", "--n-tokens", "5", "--exponent", "t^2"],
])
def test_cli_exit_status_2_one_line(args):
    res = run_cli(*args)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankcollapse: error:")


def test_graph_helpers_refuse_what_is_not_a_mask_matrix():
    import scipy.sparse as sp

    from rankcollapse.masks import bfs_distances, check_rows_allow_key

    with pytest.raises(MaskError, match="square scipy sparse matrix"):
        bfs_distances(None, 0)
    with pytest.raises(MaskError, match="source must be an integer <= 2"):
        bfs_distances(sp.eye(3, format="csr"), 3)
    for bad in (None, [1, 0], [["a", "b"], ["c", "d"]]):
        with pytest.raises(MaskError, match="a mask matrix is a bool"):
            check_rows_allow_key(bad)
    check_rows_allow_key([[True, False], [True, True]])  # a nested list of bools is a mask matrix
