"""The blocked long-sequence path equals dense masked attention on every sparse mask."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankcollapse.dynamics import RunConfig, resolve_variant, simulate
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
@pytest.mark.parametrize("variant", ["pure", "sphere", "post_ln"])
def test_simulate_paths_agree(spec, variant):
    X = torch.randn(2, N, 16)
    run = dict(depth=3, record_states=True, record_epsilon=True)
    kw = dict(mask=spec, block=resolve_variant(variant, n_heads=2), metrics=("mu", "mu_relative"))
    a = simulate(X, run=RunConfig(backend="dense", **run), **kw)
    b = simulate(X, run=RunConfig(backend="blocked", block_size=32, **run), **kw)
    assert a.config["backend"] == "dense" and b.config["backend"] == "blocked"
    for sa, sb in zip(a.states, b.states):
        torch.testing.assert_close(sa, sb, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.epsilon_measured, b.epsilon_measured, rtol=1e-3, atol=1e-12)


def test_banded_plan_touches_block_plus_window_keys():
    plan = BlockPlan(parse_mask("causal_sliding_window:w=256", 4096).to_csr(), block_size=128)
    assert plan.max_keys == 128 + 255
    assert plan.kind == "intervals" and plan.regular  # strided views of the keys, no gather
    assert plan.exceptions.tolist() == [0, 1]  # blocks whose window runs past token 0
    assert plan.n_edges == parse_mask("causal_sliding_window:w=256", 4096).n_edges


def test_layouts_by_mask_kind():
    n = 512
    kinds = {spec: BlockPlan(parse_mask(spec, n).to_csr(), block_size=32)
             for spec in ("sliding_window:w=31", "documents:lengths=100+412", "dilated:w=5,dilation=2",
                          "longformer:w=9,globals=0+300")}
    assert kinds["sliding_window:w=31"].pattern_blocked is not None
    assert kinds["documents:lengths=100+412"].kind == "intervals"
    assert kinds["dilated:w=5,dilation=2"].kind == "gathered"
    lf = kinds["longformer:w=9,globals=0+300"]
    assert lf.full_rows.tolist() == [0, 300]  # global queries go to the dense slab
    assert lf.max_keys <= 32 + 8 + 2  # block + window + the two global keys, not N


def test_auto_path_picks_blocked_for_long_sparse_masks():
    X = torch.randn(1, 8192, 4)
    res = simulate(X, mask="causal_sliding_window:w=16", metrics=("mu",), run=RunConfig(depth=1))
    assert res.config["backend"] == "blocked"
    res = simulate(X[:, :256], mask="causal_sliding_window:w=16", metrics=("mu",), run=RunConfig(depth=1))
    assert res.config["backend"] == "dense"


def test_plan_rejects_empty_rows():
    import scipy.sparse

    csr = scipy.sparse.csr_array(np.eye(4, dtype=bool)[[0, 1, 1, 3]] * np.array([1, 1, 0, 1])[:, None])
    with pytest.raises(MaskError, match=r"rows \[2\]"):
        BlockPlan(csr)


@st.composite
def _case(draw):
    n = draw(st.integers(1, 200))
    kind = draw(st.sampled_from(["sliding_window", "causal_sliding_window", "dilated", "block", "documents",
                                 "longformer", "bigbird"]))
    w = draw(st.integers(1, 40))
    if kind == "sliding_window":
        spec = f"sliding_window:w={2 * (w // 2) + 1}"
    elif kind == "causal_sliding_window":
        spec = f"causal_sliding_window:w={w}"
    elif kind == "dilated":
        causal = draw(st.booleans())
        spec = f"dilated:w={w if causal else 2 * (w // 2) + 1},dilation={draw(st.integers(1, 4))},causal={causal}"
    elif kind == "block":
        spec = f"block:size={w},causal={draw(st.booleans())}"
    elif kind == "documents":
        cuts = sorted(draw(st.sets(st.integers(1, max(1, n - 1)), max_size=4)) - {n})
        lengths = np.diff([0, *cuts, n]).tolist()
        spec = f"documents:lengths={'+'.join(map(str, lengths))},causal={draw(st.booleans())}"
    else:
        g = sorted(draw(st.sets(st.integers(0, n - 1), max_size=3)))
        spec = f"{kind}:w={2 * (w // 2) + 1},globals={'+'.join(map(str, g))}"
        if kind == "bigbird":
            spec += f",random={draw(st.integers(0, min(3, n)))},seed=1"
    return n, spec, draw(st.integers(1, 70)), draw(st.sampled_from([1, 4, 16])), draw(
        st.sampled_from([torch.float32, torch.float64])), draw(st.sampled_from([(1, 1), (2, 2)]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_case())
def test_windowed_kernel_equals_dense(case):
    """Hypothesis over N, window, block size, d, dtype and batch/heads: the windowed
    kernel (both layouts, shared patterns, dense slab) equals dense masked attention."""
    n, spec, block_size, d, dtype, (b, h) = case
    mask = parse_mask(spec, n)
    gen = torch.Generator().manual_seed(n)
    Q, K, V = (torch.randn(b, h, n, d, generator=gen, dtype=dtype) for _ in range(3))
    dense, A = dense_attention(Q, K, V, mask.to_dense(), scale=0.7, need_weights=True)
    plan = BlockPlan(mask.to_csr(), block_size=block_size)
    out, eps = blocked_attention(Q, K, V, plan, scale=0.7, need_epsilon=True)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out, dense, rtol=tol, atol=tol)
    assert float(eps) == pytest.approx(float(A[..., mask.to_dense()].min()), rel=1e-4 if dtype == torch.float32 else 1e-10)
    safe, _ = blocked_attention(Q, K, V, plan, scale=0.7, overflow=True)  # float64 score path
    torch.testing.assert_close(safe, dense, rtol=tol, atol=tol)


def test_overflowing_scores_match_dense_safe_path():
    mask = parse_mask("causal_sliding_window:w=16", 300)
    Q = torch.randn(1, 1, 300, 4) * 1e19  # q . k overflows float32
    K, V = torch.randn(1, 1, 300, 4) * 1e19, torch.randn(1, 1, 300, 4)
    dense, _ = dense_attention(Q, K, V, mask.to_dense(), scale=1.0)
    out, _ = blocked_attention(Q, K, V, BlockPlan(mask.to_csr(), block_size=32), scale=1.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense)


@pytest.mark.parametrize("spec", ["causal_sliding_window:w=17", "sliding_window:w=9", "documents:lengths=40+60,causal=true",
                                  "prefix:k=7", "complete"])
def test_plan_from_intervals_equals_plan_from_csr(spec):
    mask = parse_mask(spec, 100)
    a, b = BlockPlan(intervals=mask.intervals, block_size=16), BlockPlan(mask.to_csr(), block_size=16)
    assert (a.kind, a.max_keys, a.n_edges) == (b.kind, b.max_keys, b.n_edges)
    Q, K, V = (torch.randn(1, 2, 100, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    torch.testing.assert_close(blocked_attention(Q, K, V, a, scale=1.0)[0], blocked_attention(Q, K, V, b, scale=1.0)[0])


def test_simulate_never_builds_the_csr_of_a_window():
    mask = parse_mask("causal_sliding_window:w=8", 5000)
    simulate(torch.randn(1, 5000, 4), mask=mask, metrics=("mu",), run=RunConfig(depth=1, backend="blocked"))
    assert mask._csr is None


def test_plan_rejects_bad_intervals():
    with pytest.raises(MaskError, match="allow no key"):
        BlockPlan(intervals=(np.array([0, 1, 2]), np.array([0, 0, 2])))
    with pytest.raises(MaskError, match="exactly one"):
        BlockPlan()


def test_near_hard_attention_subnormal_weights():
    """Weights below float32's smallest normal number are dropped before A V (speed);
    the output still equals dense attention and ε still reports the subnormal minimum."""
    n = 300
    mask = parse_mask("causal_sliding_window:w=32", n)
    gen = torch.Generator().manual_seed(5)
    Q, K, V = (torch.randn(1, 1, n, 8, generator=gen) for _ in range(3))
    Q[..., 0], K[..., 0] = 1.0, 0.0
    Q[..., 1:] = 0.0
    K[..., 0, 0] = 95.0  # rows that see key 0 give the others exp(-95) ~ 5e-42: subnormal
    dense, A = dense_attention(Q, K, V, mask.to_dense(), scale=1.0, need_weights=True)
    low = A[..., mask.to_dense()].min()
    assert 0 < float(low) < torch.finfo(torch.float32).tiny
    out, eps = blocked_attention(Q, K, V, BlockPlan(mask.to_csr(), block_size=16), scale=1.0, need_epsilon=True)
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-6)
    assert float(eps) == float(low)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spec", ["causal_sliding_window:w=64", "sliding_window:w=33", "block:size=32,causal=true"])
def test_banded_fused_scores_equal_dense(spec, dtype):
    """One (B H) slice of a banded mask takes the fused path (mask and scale inside
    ``baddbmm``, the end blocks with their own bias); it equals dense attention."""
    n = 1000
    mask = parse_mask(spec, n)
    plan = BlockPlan(intervals=mask.intervals, block_size=32)
    assert plan.pattern_blocked is not None and plan.exceptions.numel() > 0
    gen = torch.Generator().manual_seed(4)
    Q, K, V = (torch.randn(1, 1, n, 16, generator=gen, dtype=dtype) for _ in range(3))
    dense, A = dense_attention(Q, K, V, mask.to_dense(), scale=0.3, need_weights=True)
    out, eps = blocked_attention(Q, K, V, plan, scale=0.3, need_epsilon=True)
    tol = 1e-5 if dtype == torch.float32 else 1e-13
    torch.testing.assert_close(out, dense, rtol=tol, atol=tol)
    assert float(eps) == pytest.approx(float(A[..., mask.to_dense()].min()), rel=tol)
    assert set(plan.biases(dtype)[0].unique().tolist()) == {0.0, float("-inf")}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [1e-30, 1.0, 1e20])
def test_simulate_mu_equals_compute_metrics(dtype, size):
    """The simulator's μ (no input checks, no rescaling) is the registry's μ of the states."""
    from rankcollapse.metrics import compute_metrics

    X = torch.randn(2, 120, 8, generator=torch.Generator().manual_seed(1), dtype=dtype) * size
    r = simulate(X, mask="causal_sliding_window:w=9", metrics=("mu", "mu_relative"),
                 run=RunConfig(depth=3, record_states=True, backend="blocked", block_size=16))
    for t, state in enumerate(r.states):
        ref = compute_metrics(state, ("mu",))["mu"].to(r.metrics["mu"].dtype)
        torch.testing.assert_close(r.metrics["mu"][t], ref, rtol=4 * torch.finfo(dtype).eps, atol=0.0)


@pytest.mark.parametrize("spec", ["causal_sliding_window:w=40", "longformer:w=7,globals=0+50", "dilated:w=5,dilation=3"])
def test_chunks_in_parallel_threads_equal_sequential_and_dense(spec, monkeypatch):
    """Many chunks (a tiny score budget) spread over two Python threads give the same
    bits as the sequential loop at one thread (each chunk's ops run on one intra-op
    thread either way: the schedule alone differs), equal dense attention, and leave the
    intra-op thread count as it was."""
    import rankcollapse.dynamics.sparse as sparse

    n = 600
    mask = parse_mask(spec, n)
    plan = BlockPlan(mask.to_csr(), block_size=16)
    gen = torch.Generator().manual_seed(2)
    Q, K, V = (torch.randn(1, 1, n, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    monkeypatch.setattr(sparse, "SCORE_BUDGET", 16 * plan.max_keys * 8 * 3)  # 3 blocks a chunk
    from rankcollapse.dynamics import chunks
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        par, eps_par = blocked_attention(Q, K, V, plan, scale=0.4, need_epsilon=True)
        assert torch.get_num_threads() == 2
        monkeypatch.setattr(chunks, "PARALLEL_CHUNKS", False)
        torch.set_num_threads(1)  # as a chunk worker runs its chunks
        seq, eps_seq = blocked_attention(Q, K, V, plan, scale=0.4, need_epsilon=True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(par, seq) and float(eps_par) == float(eps_seq)
    dense, _ = dense_attention(Q, K, V, mask.to_dense(), scale=0.4)
    torch.testing.assert_close(par, dense, rtol=1e-12, atol=1e-12)


def test_simulate_blocked_with_two_threads_restores_them_and_equals_one_thread(monkeypatch):
    import rankcollapse.dynamics.sparse as sparse

    X = torch.randn(1, 700, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    kw = dict(mask="causal_sliding_window:w=50", metrics=("mu",),
              run=RunConfig(depth=3, backend="blocked", block_size=16, record_states=True))
    monkeypatch.setattr(sparse, "SCORE_BUDGET", 16 * 66 * 8 * 4)  # several chunks a layer
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = simulate(X, **kw)
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        one = simulate(X, **kw)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(two.metrics["mu"], one.metrics["mu"])
    assert all(torch.equal(a, b) for a, b in zip(two.states, one.states))


@pytest.mark.parametrize("n, spec, block_size", [(16384, "causal_sliding_window:w=256", 64), (1000, "sliding_window:w=33", 32),
                                                 (60, "causal_sliding_window:w=40", 16), (300, "block:size=32", 32)])
def test_inner_blocks_are_the_windows_inside_the_keys(n, spec, block_size):
    """Inner blocks read keys 0 .. N-1 only (views of K and V, no padded copy); every
    other block's window reaches past an end and reads a zero-padded slab."""
    plan = BlockPlan(intervals=parse_mask(spec, n).intervals, block_size=block_size)
    assert plan.regular
    b0, b1 = plan.inner_blocks()
    starts = plan.offset + np.arange(plan.n_blocks) * block_size
    inside = (starts >= 0) & (starts + plan.max_keys <= n)
    assert inside.tolist() == [b0 <= b < b1 for b in range(plan.n_blocks)]
    if spec.startswith("causal_sliding_window:w=256"):
        assert (b0, b1) == (4, 256)  # windows of 320 keys start 256 rows before their block
    if n == 60:
        assert b0 == b1  # every window (55 keys) reaches past an end of 60 keys
    K = torch.arange(n, dtype=torch.float64)[:, None].expand(n, 2)  # row i holds i
    for b in (0, plan.n_blocks - 1):
        slab, first = plan.window_slab(K, b, b + 1)
        keys = plan.keys(slab, b, b + 1, first=first)[0, :, 0]
        want = torch.arange(starts[b], starts[b] + plan.max_keys, dtype=torch.float64)
        torch.testing.assert_close(keys, torch.where((want >= 0) & (want < n), want, 0.0))


@pytest.mark.parametrize("spec", ["causal_sliding_window:w=100", "sliding_window:w=41", "causal_sliding_window:w=300"])
@pytest.mark.parametrize("bh", [(1, 1), (2, 3)])
def test_edge_and_inner_chunks_equal_dense(spec, bh, monkeypatch):
    """Chunks of edge blocks (slabs) and of inner blocks (views), several of each, and
    values that are a strided view (the fused projection's columns): equal to dense."""
    import rankcollapse.dynamics.sparse as sparse

    n = 517
    mask = parse_mask(spec, n)
    plan = BlockPlan(intervals=mask.intervals, block_size=16)
    monkeypatch.setattr(sparse, "SCORE_BUDGET", 16 * plan.max_keys * 8 * 2 * bh[0] * bh[1])  # 2 blocks a chunk
    gen = torch.Generator().manual_seed(7)
    Q, K = (torch.randn(*bh, n, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    V = torch.randn(*bh, n, 24, generator=gen, dtype=torch.float64)[..., 8:16]  # row stride 24
    dense, _ = dense_attention(Q, K, V, mask.to_dense(), scale=0.6)
    out, _ = blocked_attention(Q, K, V, plan, scale=0.6)
    torch.testing.assert_close(out, dense, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_in_place_equals_the_separate_weights(dtype, monkeypatch):
    """Without row statistics the banded kernel's softmax overwrites the scores; with
    them it writes a separate weights buffer: the outputs are the same bits, and the
    dense path's to the dtype's round-off, over several chunks and both window ends."""
    mask = parse_mask("causal_sliding_window:w=40", 1000)
    plan = BlockPlan(intervals=mask.intervals, block_size=16)
    gen = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(1, 1, 1000, 8, generator=gen, dtype=dtype) for _ in range(3))
    assert plan.blocks_per_chunk(1, Q.element_size(), 2**14) < plan.n_blocks
    monkeypatch.setattr("rankcollapse.dynamics.sparse.CACHE_BUDGET", 2**14)  # several chunks
    monkeypatch.setattr("rankcollapse.dynamics.sparse.banded_kernel", lambda: None)  # the torch path
    a, _ = blocked_attention(Q, K, V, plan, scale=0.7)
    b, _ = blocked_attention(Q, K, V, plan, scale=0.7, row_stats={})
    assert torch.equal(a, b)
    dense, _ = dense_attention(Q, K, V, mask.to_dense(), scale=0.7)
    torch.testing.assert_close(a, dense)


def test_workspace_is_kept_per_thread():
    import threading

    plan = BlockPlan(intervals=parse_mask("causal_sliding_window:w=8", 100).intervals, block_size=16)
    a = plan.workspace("scores", (2, 16, 23), torch.float32, "cpu")
    b = plan.workspace("weights", (2, 16, 23), torch.float32, "cpu")
    assert a is plan.workspace("scores", (2, 16, 23), torch.float32, "cpu") and a is not b
    other = []
    t = threading.Thread(target=lambda: other.append(plan.workspace("scores", (2, 16, 23), torch.float32, "cpu")))
    t.start()
    t.join()
    assert other[0].data_ptr() not in (a.data_ptr(), b.data_ptr())


def test_mu_scratch_gives_the_same_bits_and_is_reused():
    from rankcollapse.dynamics.attention import kept
    from rankcollapse.metrics import mu
    from rankcollapse.metrics.core import mu_finite

    scratch: dict = {}
    X = torch.randn(3, 50, 8, generator=torch.Generator().manual_seed(0))

    def fast(Y):
        return mu_finite(Y, out=kept(scratch, "tokens", Y.shape, Y.dtype, Y.device))

    with torch.no_grad():  # as in simulate
        a = fast(X)
        buf = scratch["tokens"]
        b = fast(X * 2)
        assert scratch["tokens"] is buf
        assert torch.equal(fast(X[:, ::2]), mu_finite(X[:, ::2]))  # a smaller shape: carved from the same buffer
        assert scratch["tokens"] is buf
        assert torch.equal(fast(torch.cat([X, X], 1)), mu_finite(torch.cat([X, X], 1)))  # a larger one: a new buffer
        assert scratch["tokens"].numel() == 3 * 100 * 8
    assert torch.equal(a, mu_finite(X)) and torch.equal(b, mu_finite(X * 2))
    # the simulator's μ is the registry's, bit for bit (the registry's power-of-two scaling is exact)
    assert torch.equal(a, mu(X)) and torch.equal(b, mu(X * 2))


def test_two_threads_under_inference_mode_and_a_plan_reused_outside_it():
    """The chunk workers run in the caller's inference/grad mode, and the plan's kept
    buffers made under inference mode stay writable in later calls outside it."""
    mask = parse_mask("causal_sliding_window:w=8", 300)
    plan = BlockPlan(intervals=mask.intervals, block_size=16)
    Q, K, V = (torch.randn(1, 1, 300, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            a, _ = blocked_attention(Q, K, V, plan, scale=1.0)
            r = simulate(torch.randn(100, 8), mask="causal_sliding_window:w=8", metrics=("mu",),
                         run=RunConfig(depth=2, backend="blocked", block_size=16))
        b, _ = blocked_attention(Q, K, V, plan, scale=1.0)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(a, b) and torch.isfinite(r.metrics["mu"]).all()
    dense, _ = dense_attention(Q, K, V, mask.to_dense(), scale=1.0)
    torch.testing.assert_close(b, dense)


def _flushing_threads(threads: int) -> set[bool]:
    """Whether subnormal results are flushed, in the caller and in every chunk worker."""
    from rankcollapse.dynamics.attention import _denormals_flushed
    from rankcollapse.dynamics.chunks import over_chunks

    seen = {_denormals_flushed()}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        over_chunks(lambda _: seen.add(_denormals_flushed()), range(8), torch.device("cpu"))
    finally:
        torch.set_num_threads(before)
    return seen


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype, big", [(torch.float32, 95.0), (torch.float64, 730.0)])
def test_unread_weights_in_flush_to_zero_mode_equal_dense(dtype, big, threads, monkeypatch):
    """Without ε or row statistics the banded kernel runs in flush-to-zero mode: near-hard
    attention (weights exp(-big), subnormal) gives dense attention's output, the path that
    reads the weights gives the same, and no thread is left in that mode."""
    import rankcollapse.dynamics.sparse as sparse
    from rankcollapse.dynamics.attention import denormals_flushable

    if not denormals_flushable():
        pytest.skip("this CPU has no flush-to-zero mode")
    n = 700
    mask = parse_mask("causal_sliding_window:w=64", n)
    plan = BlockPlan(intervals=mask.intervals, block_size=32)
    gen = torch.Generator().manual_seed(6)
    Q, K, V = (torch.randn(1, 1, n, 8, generator=gen, dtype=dtype) for _ in range(3))
    Q[..., 0], K[..., 0] = 1.0, 0.0
    Q[..., 1:] = 0.0
    K[..., ::50, 0] = big  # rows that see such a key give the others exp(-big): subnormal
    dense, A = dense_attention(Q, K, V, mask.to_dense(), scale=1.0, need_weights=True)
    assert 0 < float(A[..., mask.to_dense()].min()) < torch.finfo(dtype).tiny
    monkeypatch.setattr(sparse, "CACHE_BUDGET", 32 * plan.max_keys * 8 * 3)  # several chunks
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast, _ = blocked_attention(Q, K, V, plan, scale=1.0)
        read, eps = blocked_attention(Q, K, V, plan, scale=1.0, need_epsilon=True)
    finally:
        torch.set_num_threads(before)
    tol = 1e-5 if dtype == torch.float32 else 1e-13
    torch.testing.assert_close(fast, dense, rtol=tol, atol=tol)
    torch.testing.assert_close(fast, read, rtol=tol, atol=tol)
    assert 0 < float(eps) < torch.finfo(dtype).tiny  # read before flushing
    assert _flushing_threads(2) == {False}


def test_flush_to_zero_mode_restored_on_error_and_kept_where_set(monkeypatch):
    """A chunk that raises leaves no thread in flush-to-zero mode; a caller that set the
    mode itself keeps it."""
    import rankcollapse.dynamics.sparse as sparse
    from rankcollapse.dynamics.attention import _denormals_flushed, denormals_flushable

    if not denormals_flushable():
        pytest.skip("this CPU has no flush-to-zero mode")
    n = 400
    plan = BlockPlan(intervals=parse_mask("causal_sliding_window:w=64", n).intervals, block_size=32)
    Q, K, V = (torch.randn(1, 1, n, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    monkeypatch.setattr(sparse, "CACHE_BUDGET", 32 * plan.max_keys * 4 * 2)
    seen = []

    def failing(*args, **kwargs):
        seen.append(_denormals_flushed())
        raise RuntimeError("chunk failed")

    for threads, kernel in ((1, None), (2, None), (1, failing), (2, failing)):  # torch path, native kernel
        with monkeypatch.context() as m:
            m.setattr(sparse, "_banded_scores", failing)
            m.setattr(sparse, "banded_kernel", lambda: kernel)
            before = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                with pytest.raises(RuntimeError, match="chunk failed"):
                    blocked_attention(Q, K, V, plan, scale=1.0)
            finally:
                torch.set_num_threads(before)
        assert seen and all(seen)  # the chunks ran in the mode
        assert _flushing_threads(2) == {False}
        seen.clear()
    torch.set_flush_denormal(True)
    try:
        out, _ = blocked_attention(Q, K, V, plan, scale=1.0)
        assert _denormals_flushed()
    finally:
        torch.set_flush_denormal(False)
    dense, _ = dense_attention(Q, K, V, parse_mask("causal_sliding_window:w=64", n).to_dense(), scale=1.0)
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("spec, block_size, d", [("causal_sliding_window:w=64", 32, 16),
                                                 ("sliding_window:w=33", 16, 8),
                                                 ("block:size=32,causal=true", 32, 16)])
def test_native_kernel_equals_dense_and_the_torch_path(spec, block_size, d, threads, monkeypatch):
    """The native kernel (built at install time; skipped without it) takes every block of
    float32 banded layouts whose weights nobody reads, the ends (windows past the sequence,
    padding rows) included; it equals dense attention and the torch path, near-hard rows
    (subnormal weights) and strided queries included."""
    import rankcollapse.dynamics.sparse as sparse
    from rankcollapse.dynamics.native import banded_kernel

    if banded_kernel() is None:
        pytest.skip("the native kernel is not built (python -m rankcollapse.dynamics.native)")
    n = 1000
    mask = parse_mask(spec, n)
    plan = BlockPlan(intervals=mask.intervals, block_size=block_size)
    gen = torch.Generator().manual_seed(7)
    QV = torch.randn(1, 1, n, 2 * d, generator=gen)
    Q, V = QV[..., :d], QV[..., d:]  # row stride 2 d, as the fused projection gives
    K = torch.randn(1, 1, n, d, generator=gen)
    K[..., ::97, 0] = 60.0  # rows that see such a key: weights exp(-60 |q_0| ...), some subnormal
    calls = []
    kernel = banded_kernel()
    monkeypatch.setattr(sparse, "banded_kernel", lambda: lambda *a: calls.append(a[8:10]) or kernel(*a))
    monkeypatch.setattr(sparse, "CACHE_BUDGET", block_size * plan.max_keys * 4 * 3)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, _ = blocked_attention(Q, K, V, plan, scale=0.5)
    finally:
        torch.set_num_threads(before)
    assert sorted(calls)[0][0] == 0 and sum(b1 - b0 for b0, b1 in calls) == plan.n_blocks
    dense, _ = dense_attention(Q, K, V, mask.to_dense(), scale=0.5)
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(sparse, "banded_kernel", lambda: None)
    torch.testing.assert_close(out, blocked_attention(Q, K, V, plan, scale=0.5)[0], rtol=1e-5, atol=1e-5)


def test_without_the_native_library_the_torch_path_runs(monkeypatch, tmp_path):
    """No library built for this source (an empty cache): nothing is compiled at run time,
    the kernel is None and blocked attention takes the torch path."""
    from rankcollapse.dynamics import native

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native.banded_kernel.cache_clear()
    try:
        assert native.banded_kernel() is None and not any(tmp_path.iterdir())
    finally:
        native.banded_kernel.cache_clear()


def test_native_build_goes_to_the_keyed_cache_and_names_a_missing_compiler(monkeypatch, tmp_path):
    """``build`` compiles into the cache folder under the key of source, torch, flags and CPU
    (kept there: a second build is free) and :func:`banded_kernel` loads it; with no
    compiler it raises naming it."""
    import shutil

    from rankcollapse.dynamics import native

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-cc")
    with pytest.raises(RuntimeError, match="no-such-cc"):
        native.build()
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("CC", "cc")
    native.banded_kernel.cache_clear()
    try:
        path = native.build()
        assert path == native.library_path() and path.parent == tmp_path / "rankcollapse" / "native"
        assert native.build() == path and [p.name for p in path.parent.iterdir()] == [path.name]
        assert native.banded_kernel() is not None
    except RuntimeError as e:  # a torch without the BLAS symbol, or no glibc vector maths
        pytest.skip(f"the native kernel cannot be built here: {e}")
    finally:
        native.banded_kernel.cache_clear()
