"""attention_entropy: a registry metric of attention probabilities, against a float64
numpy reference written from the formula, closed forms, and typed refusals."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.errors import MetricError
from rankcollapse.masks import parse_mask
from rankcollapse.metrics import ATTENTION_METRICS, METRICS, attention_entropy, compute_metrics


def _softmax_rows(rng, B, H, N, allowed):
    S = rng.normal(scale=3.0, size=(B, H, N, N))
    S = np.where(allowed, S, -np.inf)
    with np.errstate(invalid="ignore"):  # rows without keys (padded queries) become NaN
        E = np.exp(S - S.max(-1, keepdims=True))
        return E / E.sum(-1, keepdims=True)


def _reference(A, allowed):
    """Loops over samples, heads and rows: mean of H_i / log k_i over rows with k_i >= 2."""
    B, H, N, _ = A.shape
    out = np.zeros(B)
    for b in range(B):
        vals = []
        for h in range(H):
            for i in range(N):
                keys = np.flatnonzero(allowed[b][i]) if allowed.ndim == 3 else np.flatnonzero(allowed[i])
                if len(keys) < 2:
                    continue
                p = A[b, h, i, keys]
                p = p[p > 0]
                vals.append(-(p * np.log(p)).sum() / math.log(len(keys)))
        out[b] = np.mean(vals)
    return out


def test_matches_numpy_reference_with_mask_and_heads():
    rng = np.random.default_rng(0)
    allowed = parse_mask("causal_sliding_window:w=4", 9).to_dense().numpy()
    A = _softmax_rows(rng, 3, 2, 9, allowed)
    got = attention_entropy(torch.from_numpy(A), mask="causal_sliding_window:w=4")
    np.testing.assert_allclose(got.numpy(), _reference(A, allowed), rtol=1e-12, atol=0)


def test_padding_leaves_out_padded_queries_and_keys():
    rng = np.random.default_rng(1)
    N = 7
    pm = np.ones((2, N), dtype=bool)
    pm[1, 5:] = False
    allowed = np.ones((2, N, N), dtype=bool) & pm[:, :, None] & pm[:, None, :]
    A = np.nan_to_num(_softmax_rows(rng, 2, 3, N, allowed[:, None]))
    A[1, :, 5:, :] = 1.0 / N  # padded queries' rows hold anything (a model attends from them too): not read
    got = attention_entropy(A, padding_mask=pm)
    np.testing.assert_allclose(got.numpy(), _reference(A, allowed), rtol=1e-12, atol=0)


def test_closed_forms():
    N = 6
    uniform = torch.full((N, N), 1.0 / N, dtype=torch.float64)
    one_hot = torch.eye(N, dtype=torch.float64)
    assert float(attention_entropy(uniform)) == pytest.approx(1.0, abs=1e-15)
    assert float(attention_entropy(one_hot)) == 0.0
    causal = parse_mask("causal", N).to_dense().double()
    A = causal / causal.sum(-1, keepdim=True)  # uniform over each row's keys: 1 (row 0 has 1 key: left out)
    assert float(attention_entropy(A, mask="causal")) == pytest.approx(1.0, abs=1e-15)
    half = torch.zeros(N, N, dtype=torch.float64)
    half[:, :2] = 0.5  # two of six keys: log 2 / log 6
    assert float(attention_entropy(half)) == pytest.approx(math.log(2) / math.log(6), rel=1e-14)


def test_in_the_registry_through_compute_metrics():
    rng = np.random.default_rng(2)
    allowed = np.ones((5, 5), dtype=bool)
    A = _softmax_rows(rng, 2, 4, 5, allowed)
    X = rng.normal(size=(2, 5, 3))
    assert "attention_entropy" in ATTENTION_METRICS and "attention_entropy" not in METRICS
    out = compute_metrics(X, ["mu", "attention_entropy"], attention=A)
    assert list(out) == ["mu", "attention_entropy"]
    np.testing.assert_allclose(out["attention_entropy"].numpy(), _reference(A, allowed), rtol=1e-12)
    assert "attention_entropy" in compute_metrics(X, "all", attention=A)
    assert "attention_entropy" not in compute_metrics(X, "all")
    with pytest.raises(MetricError, match="give attention=A"):
        compute_metrics(X, ["attention_entropy"])


@pytest.mark.parametrize("A, kw, match", [
    (torch.ones(3, 4) / 4, {}, "shape"),
    (torch.full((3, 3), 0.5), {}, "sum to 1"),
    (torch.full((3, 3), -1 / 3), {}, "in \\[0, 1\\]"),
    (torch.full((3, 3), math.nan), {}, "finite"),
    (torch.full((3, 3), 1 / 3), {"mask": "causal"}, "not allow"),
    (torch.eye(3), {"mask": torch.eye(3, dtype=torch.bool)}, "two or more allowed keys"),
    (np.array([["a"]]), {}, "real numbers"),
    ([[1.0]], {}, "torch.Tensor or numpy array"),
])
def test_refusals(A, kw, match):
    with pytest.raises(MetricError, match=match):
        attention_entropy(A, **kw)


def test_simulate_routes_attention_entropy_to_the_recorded_attention():
    """simulate measures tokens; asking it for attention_entropy names the way to get it,
    and that way gives the registry's value."""
    from rankcollapse.dynamics import RunConfig, simulate
    from rankcollapse.errors import ConfigError

    X0 = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with pytest.raises(ConfigError, match="record_attention=True"):
        simulate(X0, mask="causal", metrics=["attention_entropy"], run=RunConfig(depth=2))
    res = simulate(X0, mask="causal", run=RunConfig(depth=2, dtype=torch.float64, record_attention=True))
    A = res.attention[0]
    allowed = parse_mask("causal", 6).to_dense().numpy()
    np.testing.assert_allclose(attention_entropy(A, mask="causal").numpy(),
                               _reference(A.reshape(2, -1, 6, 6).numpy(), allowed), rtol=1e-12)


def test_row_entropy_adds_nothing_for_zero_subnormal_rounding_and_nan_entries():
    """row_entropy (the computation without checks, phase's per-layer entropy): p log p
    with p clamped at the smallest normal number, entries not > 0 (zeros, the NaN of an
    overflowed run) adding nothing, written element by element; its input is left as it was."""
    from rankcollapse.metrics.attention import row_entropy

    tiny = torch.finfo(torch.float64).tiny
    A = torch.tensor([[[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1e-310, 0.25, 0.75 - 1e-310]]],
                      [[[1.0, 0.0, 0.0], [math.nan, math.nan, 0.0], [0.2, 0.3, 0.5]]]], dtype=torch.float64)
    allowed = torch.ones(3, 3, dtype=torch.bool).tril()
    before = A.clone()
    got = row_entropy(A, allowed)
    plogp = torch.where(A > 0, A * torch.log(A.clamp_min(tiny)), torch.zeros((), dtype=A.dtype))
    k = allowed.sum(-1).to(A.dtype)  # keys per row: 1, 2, 3
    counted = (k >= 2).to(A.dtype)
    expected = (-plogp.sum(-1) / torch.log(k.clamp_min(2)) * counted).sum(dim=(-1, -2)) / counted.sum()
    assert torch.equal(got, expected)
    assert torch.equal(A.nan_to_num(), before.nan_to_num()) and torch.isnan(A).sum() == 2
    assert float(got[0]) == pytest.approx((math.log(2) / math.log(2) + (0.25 * math.log(4) + 0.75 * math.log(4 / 3))
                                           / math.log(3)) / 2, rel=1e-14)
