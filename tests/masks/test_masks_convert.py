"""Conversions round-trip exactly: dense -> sparse -> FlexAttention / HF -> dense; FlexAttention
block masks built from the CSR form have the same tiles as ``create_block_mask`` (which
evaluates the predicate on all N^2 pairs), in O(E) memory."""

import tracemalloc

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask
from transformers import masking_utils as mu

from rankcollapse.errors import MaskError
from rankcollapse.masks import Mask, parse_mask
from rankcollapse.masks.convert import (
    block_counts,
    block_mask_to_dense,
    from_additive,
    from_block_mask,
    from_hf_4d,
    to_additive,
    to_block_mask,
    to_hf_4d,
)

SPECS = [
    "complete", "causal", "sliding_window:w=5", "causal_sliding_window:w=4",
    "dilated:w=3,dilation=2,causal=true", "prefix:k=3", "block:size=4", "documents:lengths=3+4+{rest}",
    "strided:stride=3", "fixed:stride=4,c=1", "longformer:w=3,globals=0+7",
    "bigbird:w=3,globals=1,random=2,seed=0", "random:p=0.2,seed=1", "causal&sliding_window:w=7",
]
SIZES = [9, 13]


def _mask(spec, n):
    return parse_mask(spec.format(rest=n - 7), n)


@pytest.mark.parametrize("spec", SPECS)
def test_dense_sparse_additive_hf_round_trip(spec):
    for n in SIZES:
        m = _mask(spec, n)
        dense = m.to_dense()
        assert dense.dtype == torch.bool and dense.shape == (n, n)
        np.testing.assert_array_equal(dense.numpy(), m.to_csr().toarray())
        again = Mask.from_dense(dense)
        assert again == m
        add = to_additive(again)
        assert torch.equal(add == 0, dense) and torch.isinf(add[~dense]).all()
        assert from_additive(add) == m
        assert from_additive(to_additive(m, fill="min", dtype=torch.bfloat16)) == m
        for form in ("bool", "additive"):
            hf = to_hf_4d(Mask.from_csr(m.to_csr()), batch_size=2, form=form, dtype=torch.float16)
            assert hf.shape == (2, 1, n, n)
            assert from_hf_4d(hf, batch_index=1) == m


@pytest.mark.parametrize("spec", SPECS)
def test_flex_attention_block_mask_round_trip(spec):
    for n, block in ((9, 4), (13, 8)):
        m = _mask(spec, n)
        sparse_again = Mask.from_csr(m.to_csr())  # dense -> sparse, predicate rebuilt
        for mask in (m, sparse_again):
            bm = to_block_mask(mask, block_size=block)
            assert torch.equal(block_mask_to_dense(bm), m.to_dense())
        assert from_block_mask(to_block_mask(m, block_size=block)) == m


def test_hf_sdpa_and_eager_masks_from_our_predicate():
    for spec in SPECS:
        m = _mask(spec, 11)
        ref = mu.sdpa_mask(batch_size=1, q_length=11, kv_length=11, mask_function=m.mask_mod,
                           allow_is_causal_skip=False)
        assert torch.equal(ref, to_hf_4d(m, form="bool"))
        eager = mu.eager_mask(batch_size=1, q_length=11, kv_length=11, mask_function=m.mask_mod,
                              dtype=torch.float32)
        assert torch.equal(eager, to_hf_4d(m, form="additive", dtype=torch.float32))


@pytest.mark.parametrize("w", [1, 2, 3, 4, 8])
def test_window_conventions_match_transformers(w):
    n = 12
    hf = mu.sdpa_mask(batch_size=1, q_length=n, kv_length=n,
                      mask_function=mu.sliding_window_causal_mask_function(w),
                      allow_is_causal_skip=False)
    assert torch.equal(hf[0, 0], parse_mask(f"causal_sliding_window:w={w}", n).to_dense())
    # HF's bidirectional window is the half width h: |q - kv| <= h, ours is w = 2h + 1
    hf = mu.sdpa_mask(batch_size=1, q_length=n, kv_length=n,
                      mask_function=mu.sliding_window_bidirectional_mask_function(w),
                      allow_is_causal_skip=False)
    assert torch.equal(hf[0, 0], parse_mask(f"sliding_window:w={2 * w + 1}", n).to_dense())
    assert torch.equal(
        mu.sdpa_mask(batch_size=1, q_length=n, kv_length=n, mask_function=mu.causal_mask_function,
                     allow_is_causal_skip=False)[0, 0],
        parse_mask("causal", n).to_dense(),
    )


def test_masked_softmax_uses_our_dense_mask_exactly():
    from rankcollapse.dynamics.attention import masked_softmax

    m = parse_mask("fixed:stride=3,c=1", 10)
    a = masked_softmax(torch.randn(10, 10, generator=torch.Generator().manual_seed(0)), m.to_dense())
    assert torch.equal(a > 0, m.to_dense())
    torch.testing.assert_close(a.sum(-1), torch.ones(10))


BLOCK_SPECS = ["causal_sliding_window:w=5", "sliding_window:w=7", "block:size=6,causal=true",
               "documents:lengths=7+20+{rest}", "dilated:w=3,dilation=2", "longformer:w=3,globals=0+9", "causal",
               "complete", "prefix:k=3"]


def _tiles(bm):
    return [t.tolist() for t in (bm.kv_num_blocks, bm.full_kv_num_blocks)], [
        sorted(row[:k]) for row, k in zip(bm.kv_indices[0, 0].tolist(), bm.kv_num_blocks[0, 0].tolist())]


@pytest.mark.parametrize("spec", BLOCK_SPECS)
@pytest.mark.parametrize("n, block", [(32, 8), (37, 8), (40, 16)])
def test_same_tiles_as_create_block_mask(spec, n, block):
    m = parse_mask(spec.format(rest=n - 27), n)
    ours = to_block_mask(m, block_size=block)
    ref = create_block_mask(m.mask_mod, None, None, n, n, device="cpu", BLOCK_SIZE=block)
    assert _tiles(ours) == _tiles(ref)
    assert torch.equal(block_mask_to_dense(ours), m.to_dense())


def test_block_counts_are_tile_sums():
    m = parse_mask("bigbird:w=5,globals=3,random=2,seed=4", 50)
    dense = m.to_numpy()
    padded = np.zeros((56, 56), dtype=np.int64)
    padded[:50, :50] = dense
    expect = padded.reshape(7, 8, 7, 8).sum(axis=(1, 3))
    assert np.array_equal(block_counts(m, 8, rows_per_chunk=16), expect)


def test_no_quadratic_memory():
    n = 32768  # the dense bool matrix alone would be 1 GiB
    m = parse_mask("causal_sliding_window:w=64", n)
    m.to_csr()
    tracemalloc.start()
    bm = to_block_mask(m, block_size=128)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 128 * 2**20  # about 48 MiB measured; the dense matrix would be 1 GiB, a worker's imports add some
    assert bm.kv_num_blocks.sum() + bm.full_kv_num_blocks.sum() == 256 + 255  # diagonal + one band below


def test_bad_block_size():
    with pytest.raises(MaskError, match="block_size"):
        to_block_mask(Mask.from_dense(np.eye(3, dtype=bool)), block_size=0)
