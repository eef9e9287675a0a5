"""Composition: precedence, parentheses, and composed specs that parse back to the same mask."""

import json

import numpy as np
import pytest

from rankcollapse.errors import MaskError
from rankcollapse.masks import block, causal, complete, parse_mask, sliding_window


def dense(m):
    return m.to_numpy()


@pytest.mark.parametrize("n", [1, 7, 12])
def test_and_binds_tighter_and_parentheses_group(n):
    c, s, b = dense(causal(n)), dense(sliding_window(n, 3)), dense(block(n, 2))
    assert np.array_equal(dense(parse_mask("causal|sliding_window:w=3&block:size=2", n)), c | (s & b))
    assert np.array_equal(dense(parse_mask("(causal|sliding_window:w=3)&block:size=2", n)), (c | s) & b)
    assert np.array_equal(dense(parse_mask(" ( causal ) & ( complete | causal ) ", n)), c)


@pytest.mark.parametrize("n", [5, 16])
def test_composed_spec_rebuilds_the_mask(n):
    built = [
        (causal(n) | sliding_window(n, 3)) & block(n, 2),
        causal(n) & (sliding_window(n, 3) | block(n, 4)),
        (causal(n) & sliding_window(n, 5)) | block(n, 3),
        ((causal(n) | block(n, 2)) & sliding_window(n, 3)) | complete(n) & causal(n),
    ]
    for m in built:
        again = parse_mask(m.spec, n)
        assert again == m, m.spec
        assert again.spec == m.spec


@pytest.mark.parametrize("spec, message", [
    ("(causal", "missing ')'"),
    ("causal)", "unexpected ')'"),
    ("()", "empty mask spec"),
    ("(causal|)", "empty mask spec"),
    ("causal&&complete", "empty mask spec"),
    ("|causal", "empty mask spec"),
    ("(" * 5000 + "causal" + ")" * 5000, "nests parentheses 5000 deep; at most 64"),  # not a RecursionError
])
def test_malformed_compositions(spec, message):
    with pytest.raises(MaskError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_mask(spec, 6)


def test_nesting_up_to_the_limit_is_one_mask():
    from rankcollapse.masks.spec import MAX_NESTING

    assert parse_mask("(" * MAX_NESTING + "causal" + ")" * MAX_NESTING, 6) == parse_mask("causal", 6)


@pytest.mark.parametrize("suffix", [".txt", ".npy"])
def test_rows_are_checked_on_the_composed_mask_not_its_parts(tmp_path, suffix):
    """Row 0 of the file allows no key; the union with causal gives it key 0. The rule "every
    row allows a key" is the composed mask's (the one attention uses); a composition that does
    leave an empty row is still refused, naming the whole and its first empty rows."""
    from tests.cli._harness import run_cli

    rows = np.array([[0, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=bool)  # row 0 empty
    path = tmp_path / f"e1{suffix}"
    if suffix == ".npy":
        np.save(path, rows)
    else:
        path.write_text("1 0\n1 1\n2 2\n")
    union = parse_mask(f"file:{path}|causal", 3)
    assert np.array_equal(dense(union), rows | dense(causal(3)))
    assert np.array_equal(dense(parse_mask(f"file:{path}&causal|complete", 3)), np.ones((3, 3), bool))
    assert np.array_equal(dense(parse_mask(f"(file:{path}|causal)&causal", 3)), dense(causal(3)))
    for spec in (f"file:{path}", f"(file:{path})", f"file:{path}&causal", f"(file:{path}|causal)&file:{path}"):
        with pytest.raises(MaskError, match=r"rows \[0\] allow no key") as info:
            parse_mask(spec, 3)
        whole = spec[1:-1] if spec == f"(file:{path})" else spec  # a group of one is its atom
        assert f"mask {whole!r}:" in str(info.value)
    res = run_cli("mask", "describe", f"file:{path}|causal", "--n-tokens", "3", "--format", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["n_edges"] == 6
