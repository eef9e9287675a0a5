"""One mask type for every form a mask comes in (resolve_mask returns a Mask), and the one
empty-row check."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from rankcollapse.errors import MaskError, MetricError
from rankcollapse.masks import Mask, causal, causal_sliding_window, check_rows_allow_key, dense_mask, resolve_mask
from rankcollapse.masks.rows import empty_rows

TRIL = torch.ones(5, 5, dtype=torch.bool).tril()


@pytest.mark.parametrize("form", [
    lambda: "causal", lambda: causal(5), lambda: TRIL, lambda: TRIL.numpy(), lambda: TRIL.int(),
    lambda: sp.csr_array(TRIL.numpy()), lambda: sp.coo_matrix(TRIL.numpy().astype(float)),
])
def test_every_form_resolves_to_the_same_mask(form):
    m = resolve_mask(form(), 5)
    assert isinstance(m, Mask)
    assert torch.equal(m.to_dense(), TRIL) and m.n_tokens == 5 and m.n_edges == 15
    assert (m.to_csr() != sp.csr_array(TRIL.numpy())).nnz == 0
    assert m == causal(5)
    assert torch.equal(dense_mask(form(), 5), TRIL)


def test_spec_is_kept_and_n_comes_from_the_shape():
    assert resolve_mask(causal_sliding_window(6, 2)).spec == "causal_sliding_window:w=2"
    assert resolve_mask(TRIL).n_tokens == 5 and resolve_mask(TRIL).spec == "dense:n=5"
    assert resolve_mask(sp.csr_array(TRIL.numpy())).spec == "sparse:n=5"
    with pytest.raises(MaskError, match="needs the number of tokens"):
        resolve_mask("causal")


@pytest.mark.parametrize("bad, text", [
    (torch.ones(5, 4, dtype=torch.bool), r"shape \(5, 5\) for N=5 tokens, got \(5, 4\)"),
    (torch.full((5, 5), 0.5), "boolean"),
    (torch.full((5, 5), 2), "boolean"),
    (causal(6), r"got \(6, 6\)"),
])
def test_bad_forms_are_named(bad, text):
    with pytest.raises(MaskError, match=text):
        resolve_mask(bad, 5)
    with pytest.raises(MaskError, match=text):
        dense_mask(bad, 5)


def test_empty_rows_named_in_every_form():
    M = TRIL.clone()
    M[[1, 3]] = False
    for form in (M, M.numpy(), sp.csr_array(M.numpy())):
        with pytest.raises(MaskError, match=r"^mask '(dense|sparse):n=5': rows \[1, 3\] allow no key \(softmax over nothing\)$"):
            resolve_mask(form, 5)
    stored_zero = sp.csr_array((np.array([True, False]), np.array([0, 0]), np.array([0, 1, 2])), shape=(2, 2))
    assert empty_rows(stored_zero).tolist() == [1]  # an explicit False is not a key
    many = torch.zeros(30, 30, dtype=torch.bool)
    many[0, 0] = True
    with pytest.raises(MaskError, match=r"rows \[1, 2, .*, 10\] \(and 19 more\)"):
        check_rows_allow_key(many, "x")
    batch = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    batch[1, 0, 2] = False  # empty in one batch entry only
    assert empty_rows(batch).tolist() == [2]


def test_graph_metrics_options():
    M = TRIL.clone()
    M[2] = False
    assert torch.equal(dense_mask(M, 5, require_keys=False), M)  # a graph may lack in-edges
    stack = torch.stack([TRIL, TRIL.T])
    assert dense_mask(stack, 5, n_samples=2).shape == (2, 5, 5)
    with pytest.raises(MetricError, match=r"\(5, 5\) or \(3, 5, 5\)"):
        dense_mask(stack, 5, n_samples=3, error=MetricError)


def test_mask_type_uses_the_same_check():
    with pytest.raises(MaskError, match=r"^mask 'dense:n=2': rows \[1\] allow no key"):
        Mask.from_dense(np.array([[1, 0], [0, 0]], dtype=bool))


def test_a_mask_is_resolved_as_itself_not_copied_or_checked_again():
    m = causal(5)
    assert resolve_mask(m, 5) is m and resolve_mask(m) is m


def test_float_matrices_are_refused_by_every_constructor():
    """One rule (bool or 0/1 integers) for Mask.from_dense and resolve_mask: a float 0/1
    matrix was accepted by one and refused by the other."""
    for make in (Mask.from_dense, resolve_mask, lambda x: dense_mask(x, 3)):
        with pytest.raises(MaskError, match="boolean"):
            make(np.eye(3))
    assert Mask.from_dense(np.eye(3, dtype=np.int8)) == Mask.from_dense(np.eye(3, dtype=bool))


def test_sparse_and_meta_tensors_are_refused_by_the_mask_type():
    with pytest.raises(MaskError, match="sparse_coo"):
        Mask.from_dense(TRIL.to_sparse())
    with pytest.raises(MaskError, match="meta device"):
        resolve_mask(torch.ones(5, 5, dtype=torch.bool, device="meta"), 5)


def test_window_masks_count_edges_without_building_the_csr():
    m = causal_sliding_window(1_000_000, 3)
    assert m.n_edges == 3 * 1_000_000 - 3 and not m.is_built
    small = causal_sliding_window(9, 3)
    assert small.n_edges == small.to_csr().nnz == 3 * 9 - 3


def test_intervals_with_an_empty_row_are_refused_at_construction():
    lo, hi = np.array([0, 1, 2]), np.array([0, 0, 2])
    with pytest.raises(MaskError, match=r"^mask 'custom': rows \[1\] allow no key"):
        Mask(3, "custom", intervals=(lo, hi))
    with pytest.raises(MaskError, match=r"shape \(3,\)"):
        Mask(3, "custom", intervals=(lo[:2], hi[:2]))
