"""Huge tokens and logits: no silent zeros, no NaN, unit rows under `sphere`, finite metrics."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.dynamics.attention import dense_attention
from rankcollapse.dynamics.layers import sphere
from rankcollapse.dynamics.sparse import BlockPlan, blocked_attention
from rankcollapse.masks import parse_mask


def reference_attention(Q, K, V, M, scale):
    """float64 numpy masked softmax attention (spec.md §1)."""
    q, k, v = (t.double().numpy() for t in (Q, K, V))
    S = np.where(M.numpy(), q @ k.swapaxes(-1, -2) * scale, -np.inf)
    E = np.exp(S - S.max(-1, keepdims=True))
    return torch.from_numpy((E / E.sum(-1, keepdims=True)) @ v)


def huge_qkv(n=12, scale=3e19):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, 2, n, 4, generator=gen) * scale for _ in range(3)]


@pytest.mark.parametrize("need_weights", [False, True])
def test_dense_attention_with_overflowing_scores_is_exact(need_weights):
    Q, K, V = huge_qkv()  # q . k ~ 1e39: +-inf in float32
    M = parse_mask("causal", 12).to_dense()
    out, _ = dense_attention(Q, K, V, M, scale=0.5, need_weights=need_weights)
    ref = reference_attention(Q, K, V, M, 0.5)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


@pytest.mark.parametrize("need_epsilon", [False, True])
def test_blocked_attention_with_overflowing_scores_is_exact(need_epsilon):
    Q, K, V = huge_qkv()
    mask = parse_mask("sliding_window:w=5", 12)
    out, _ = blocked_attention(Q, K, V, BlockPlan(mask.to_csr(), block_size=5), scale=0.5,
                               need_epsilon=need_epsilon)
    ref = reference_attention(Q, K, V, mask.to_dense(), 0.5)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


@pytest.mark.parametrize("backend", ["dense", "blocked"])
def test_growing_pure_sa_matches_float64_until_x_itself_overflows(backend):
    # W_V = 3 I: ||X(t)|| grows like 3^t, past float32's squared range (1e19) at t ~ 40
    X0 = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(1))
    amax = {"amax": lambda X: X.abs().amax((1, 2))}
    kw = dict(mask="causal", value="scaled_identity:scale=3", metrics=amax)
    run = dict(depth=60, backend=backend, block_size=4, record_states=True)
    a = simulate(X0, run=RunConfig(dtype=torch.float32, **run), **kw)
    b = simulate(X0, run=RunConfig(dtype=torch.float64, **run), **kw)
    assert float(a.metrics["amax"][-1].min()) > 1e25  # not collapsed to exact zeros
    for sa, sb in zip(a.states, b.states):
        torch.testing.assert_close(sa.double(), sb, rtol=1e-3, atol=1e-3 * float(sb.abs().max()))


def test_default_metrics_stay_finite_for_huge_finite_float32_tokens():
    X0 = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(2))
    res = simulate(X0, mask="causal", value="scaled_identity:scale=3", run=RunConfig(depth=75, dtype=torch.float32))
    ref = simulate(X0, mask="causal", value="scaled_identity:scale=3", run=RunConfig(depth=75, dtype=torch.float64))
    assert bool(torch.isfinite(res.metrics["mu"]).all()) and bool(torch.isfinite(res.metrics["mu_relative"]).all())
    torch.testing.assert_close(res.metrics["mu_relative"], ref.metrics["mu_relative"], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sphere_puts_huge_rows_on_the_unit_sphere(dtype):
    big = math.sqrt(torch.finfo(dtype).max)  # squaring overflows
    X = torch.tensor([[3.0, 4.0], [big, -big], [0.0, 0.0], [1e-30, 0.0]], dtype=dtype)
    Y, zero = sphere(X)
    expect = torch.tensor([[0.6, 0.8], [2**-0.5, -(2**-0.5)], [0.0, 0.0], [1.0, 0.0]], dtype=dtype)
    torch.testing.assert_close(Y, expect)
    assert int(zero) == 1
