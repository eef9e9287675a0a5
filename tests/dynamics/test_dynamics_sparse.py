"""The blocked long-sequence path equals dense masked attention on every sparse mask."""

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import simulate
from rankcollapse.dynamics.attention import dense_attention
from rankcollapse.dynamics.sparse import BlockPlan, blocked_attention
from rankcollapse.errors import MaskError
from rankcollapse.masks import parse_mask

N = 97  # not a multiple of any block size below
SPECS = [
    "sliding_window:w=9",
    "causal_sliding_window:w=8",
    "dilated:w=5,dilation=3",
    "dilated:w=4,dilation=2,causal=true",
    "block:size=16",
    "block:size=10,causal=true",
    "longformer:w=7,globals=0+50",
    "bigbird:w=5,globals=0,random=3,seed=1",
    "strided:stride=10",
    "documents:lengths=30+40+27",
    "random:p=0.05,seed=2",
    "causal",
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("block_size", [5, 128])
def test_blocked_equals_dense(spec, block_size):
    mask = parse_mask(spec, N)
    gen = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(2, 3, N, 8, generator=gen) for _ in range(3))
    dense, A = dense_attention(Q, K, V, mask.to_dense(), scale=0.5, need_weights=True)
    plan = BlockPlan(mask.to_csr(), block_size=block_size)
    for need_eps in (False, True):
        out, eps = blocked_attention(Q, K, V, plan, scale=0.5, need_epsilon=need_eps)
        torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-5)
        if need_eps:
            assert float(eps) == pytest.approx(float(A[..., mask.to_dense()].min()), rel=1e-4)


@pytest.mark.parametrize("spec", ["sliding_window:w=9", "longformer:w=7,globals=3", "bigbird:w=5,globals=0,random=2"])
@pytest.mark.parametrize("variant", ["pure", "ln", "skip_ln"])
def test_simulate_paths_agree(spec, variant):
    X = torch.randn(2, N, 16)
    kw = dict(mask=spec, depth=3, variant=variant, n_heads=2, record_states=True, record_epsilon=True,
              metrics=("mu", "mu_relative"))
    a, b = simulate(X, path="dense", **kw), simulate(X, path="blocked", block_size=32, **kw)
    assert a.config["path"] == "dense" and b.config["path"] == "blocked"
    for sa, sb in zip(a.states, b.states):
        torch.testing.assert_close(sa, sb, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.epsilon, b.epsilon, rtol=1e-3, atol=1e-12)


def test_banded_plan_touches_block_plus_window_keys():
    plan = BlockPlan(parse_mask("causal_sliding_window:w=256", 4096).to_csr(), block_size=128)
    assert plan.max_keys == 128 + 255
    assert all(b.keys is None for b in plan.blocks)  # contiguous: sliced, not gathered
    assert plan.n_edges == parse_mask("causal_sliding_window:w=256", 4096).n_edges


def test_auto_path_picks_blocked_for_long_sparse_masks():
    X = torch.randn(1, 8192, 4)
    res = simulate(X, mask="causal_sliding_window:w=16", depth=1, metrics=("mu",))
    assert res.config["path"] == "blocked"
    res = simulate(X[:, :256], mask="causal_sliding_window:w=16", depth=1, metrics=("mu",))
    assert res.config["path"] == "dense"


def test_plan_rejects_empty_rows():
    import scipy.sparse

    csr = scipy.sparse.csr_array(np.eye(4, dtype=bool)[[0, 1, 1, 3]] * np.array([1, 1, 0, 1])[:, None])
    with pytest.raises(MaskError, match=r"rows \[2\]"):
        BlockPlan(csr)
