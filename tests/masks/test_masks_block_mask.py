"""FlexAttention block masks built from the CSR form: the same tiles as
``create_block_mask`` (which evaluates the predicate on all N^2 pairs), in O(E) memory."""

import tracemalloc

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from rankcollapse.errors import MaskError
from rankcollapse.masks import Mask, parse_mask
from rankcollapse.masks.convert import block_counts, block_mask_to_dense, to_block_mask

SPECS = ["causal_sliding_window:w=5", "sliding_window:w=7", "block:size=6,causal=true", "documents:lengths=7+20+{rest}",
         "dilated:w=3,dilation=2", "longformer:w=3,globals=0+9", "causal", "complete", "prefix:k=3"]


def _tiles(bm):
    return [t.tolist() for t in (bm.kv_num_blocks, bm.full_kv_num_blocks)], [
        sorted(row[:k]) for row, k in zip(bm.kv_indices[0, 0].tolist(), bm.kv_num_blocks[0, 0].tolist())]


@pytest.mark.parametrize("spec", SPECS)
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
