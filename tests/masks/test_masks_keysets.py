"""Every constructor's key set equals the rule stated in its docstring, written here
independently as a plain Python predicate over (i, j)."""

import math

import numpy as np
import pytest

from rankcollapse.masks import parse_mask


def _rule_matrix(n, rule):
    return np.array([[bool(rule(i, j)) for j in range(n)] for i in range(n)])


def _docs(lengths):
    return np.repeat(np.arange(len(lengths)), lengths)


RULES = {
    "complete": lambda n: lambda i, j: True,
    "causal": lambda n: lambda i, j: j <= i,
    "sliding_window:w=5": lambda n: lambda i, j: abs(i - j) <= 2,
    "sliding_window:w=1": lambda n: lambda i, j: i == j,
    "causal_sliding_window:w=4": lambda n: lambda i, j: i - 3 <= j <= i,
    "dilated:w=3,dilation=2": lambda n: lambda i, j: (i - j) % 2 == 0 and abs(i - j) <= 2,
    "dilated:w=3,dilation=3,causal=true": lambda n: lambda i, j: j <= i and (i - j) % 3 == 0 and i - j <= 6,
    "prefix:k=3": lambda n: lambda i, j: (i < 3 and j < 3) or j <= i,
    "block:size=4": lambda n: lambda i, j: i // 4 == j // 4,
    "block:size=4,causal=true": lambda n: lambda i, j: i // 4 == j // 4 and j <= i,
    "strided:stride=3": lambda n: lambda i, j: j <= i and (max(0, i - 3) <= j or (i - j) % 3 == 0),
    "fixed:stride=4,c=2": lambda n: lambda i, j: j <= i and (j // 4 == i // 4 or j % 4 >= 2),
    "longformer:w=3,globals=0+7": lambda n: lambda i, j: abs(i - j) <= 1 or i in (0, 7) or j in (0, 7),
}


MIN_N = {"prefix:k=3": 3, "longformer:w=3,globals=0+7": 8}  # smaller N is an error case
CASES = [(s, n) for s in sorted(RULES) for n in (1, 2, 7, 8, 13) if n >= MIN_N.get(s, 1)]


@pytest.mark.parametrize(("spec", "n"), CASES)
def test_key_set_matches_stated_rule(spec, n):
    m = parse_mask(spec, n)
    expected = _rule_matrix(n, RULES[spec](n))
    np.testing.assert_array_equal(m.to_csr().toarray(), expected)
    np.testing.assert_array_equal(m.to_dense().numpy(), expected)  # predicate path
    assert m.n_edges == int(expected.sum())


@pytest.mark.parametrize("causal", [False, True])
def test_documents_key_set(causal):
    lengths = [3, 5, 8]
    doc = _docs(lengths)
    m = parse_mask(f"documents:lengths=3+5+8,causal={str(causal).lower()}", 16)
    expected = _rule_matrix(16, lambda i, j: doc[i] == doc[j] and (j <= i or not causal))
    np.testing.assert_array_equal(m.to_dense().numpy(), expected)
    np.testing.assert_array_equal(m.to_csr().toarray(), expected)


def test_bigbird_window_globals_and_exact_random_count():
    n, r = 40, 3
    m = parse_mask(f"bigbird:w=3,globals=5,random={r},seed=7", n)
    dense = m.to_csr().toarray()
    window = _rule_matrix(n, lambda i, j: abs(i - j) <= 1 or i == 5 or j == 5)
    assert (dense >= window).all()  # window and globals always present
    extra = dense & ~window
    # each non-global row gains at most r keys beyond the window (random ones may overlap it)
    assert extra.sum(axis=1).max() <= r
    assert extra.sum() > 0.5 * r * (n - 1)
    again = parse_mask(f"bigbird:w=3,globals=5,random={r},seed=7", n)
    assert again == m
    assert parse_mask(f"bigbird:w=3,globals=5,random={r},seed=8", n) != m


def test_random_is_erdos_renyi_with_self_loops_and_seeded():
    n, p = 300, 0.05
    m = parse_mask(f"random:p={p},seed=3", n)
    dense = m.to_csr().toarray()
    assert dense.diagonal().all()
    off = dense.sum() - n
    mean, sd = n * (n - 1) * p, math.sqrt(n * (n - 1) * p * (1 - p))
    assert abs(off - mean) < 5 * sd
    assert parse_mask(f"random:p={p},seed=3", n) == m
    assert parse_mask("random:p=0,seed=1", 5) == parse_mask("sliding_window:w=1", 5)
    assert parse_mask("random:p=1", 6) == parse_mask("complete", 6)


def test_composition_and_or():
    n = 12
    both = parse_mask("causal&sliding_window:w=9", n)
    np.testing.assert_array_equal(both.to_dense().numpy(), _rule_matrix(n, lambda i, j: i - 4 <= j <= i))
    either = parse_mask("block:size=4|prefix:k=2", n)
    rule = lambda i, j: i // 4 == j // 4 or (i < 2 and j < 2) or j <= i  # noqa: E731
    np.testing.assert_array_equal(either.to_csr().toarray(), _rule_matrix(n, rule))
    np.testing.assert_array_equal(either.to_dense().numpy(), _rule_matrix(n, rule))
    # & binds tighter than |
    mixed = parse_mask("causal&block:size=3|prefix:k=2", n)
    rule2 = lambda i, j: (j <= i and i // 3 == j // 3) or (i < 2 and j < 2) or j <= i  # noqa: E731
    np.testing.assert_array_equal(mixed.to_csr().toarray(), _rule_matrix(n, rule2))


def test_file_masks(tmp_path):
    n = 6
    dense = np.eye(n, dtype=bool)
    dense[3, 0] = dense[5, 2] = True
    np.save(tmp_path / "m.npy", dense)
    np.testing.assert_array_equal(parse_mask(f"file:{tmp_path / 'm.npy'}", n).to_dense().numpy(), dense)
    lines = ["# i attends to j"] + [f"{i} {j}" for i, j in zip(*np.nonzero(dense))]
    (tmp_path / "m.txt").write_text("\n".join(lines) + "\n")
    m = parse_mask(f"file:{tmp_path / 'm.txt'}", n)
    np.testing.assert_array_equal(m.to_dense().numpy(), dense)
    np.testing.assert_array_equal(m.to_csr().toarray(), dense)
