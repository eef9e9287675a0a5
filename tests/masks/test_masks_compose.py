"""Composition: precedence, parentheses, and composed specs that parse back to the same mask."""

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
