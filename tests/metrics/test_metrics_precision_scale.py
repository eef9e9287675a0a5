"""Rank at low storage precision and scale invariance over the dtype's normal range."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rankcollapse import metrics as M

INVARIANT = (
    "avg_abs_cos",
    "avg_cos",
    "cos_to_mean",
    "numerical_rank",
    "rank_fraction",
    "stable_rank",
    "effective_rank",
    "isoscore",
    "mu_relative",
    "sigma_ratio",
    "dong_residual_relative",
    "mean_average_distance",
)
EQUIVARIANT = {"mu": 1, "sigma_min": 1, "rank_one_distance": 1, "dong_residual": 1, "dirichlet_energy": 2}


def _gaussian(dtype):
    """(128, 384) standard Gaussian; condition number 3.74 in float64."""
    return torch.randn(128, 384, generator=torch.Generator().manual_seed(0)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("compute", [None, torch.float32, torch.float64])
def test_well_conditioned_gaussian_has_full_rank_at_every_storage_precision(dtype, compute):
    X = _gaussian(dtype)
    S = np.linalg.svd(X.double().numpy(), compute_uv=False)
    assert S[0] / S[-1] == pytest.approx(3.74, abs=0.01)  # well conditioned whatever the rounding
    assert float(M.rank_fraction(X, dtype=compute)) == 1.0
    assert float(M.compute_metrics(X, ("numerical_rank",), dtype=compute)["numerical_rank"]) == 128


def test_noise_floor_is_the_storage_roundoff_times_the_frobenius_norm():
    # bfloat16: u = 2^-8; floor u ||X||_F = 0.866 < sigma_min = 8.21 (Weyl: not rounding alone)
    X = _gaussian(torch.bfloat16)
    Xd = X.double()
    floor = 2.0**-8 * float(torch.linalg.norm(Xd))
    assert floor == pytest.approx(0.8659, abs=1e-3)
    # a matrix with singular values straddling the floor: 64 at 10, 64 at 0.5
    U, _ = torch.linalg.qr(torch.randn(128, 128, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(384, 128, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    s = torch.cat([torch.full((64,), 10.0), torch.full((64,), 0.05)]).double()
    Y = (U * s) @ V.mT
    u_fro = 2.0**-8 * float(torch.linalg.norm(Y))  # 0.3125: between the two groups
    assert 0.05 < u_fro < 10
    Yb = Y.to(torch.bfloat16)
    assert float(M.numerical_rank(Yb)) == 64
    # without the floor only the SVD's float32 error counts: the rounding noise is rank
    assert float(M.numerical_rank(Yb, noise_floor=False)) == 128
    assert float(M.numerical_rank(Y)) == 128  # float64 storage: 0.05 is real


def test_explicit_tolerances_replace_both_terms():
    X = _gaussian(torch.bfloat16)
    S = np.linalg.svd(X.double().numpy(), compute_uv=False)
    assert float(M.numerical_rank(X, rtol=0.5)) == int((S > 0.5 * S[0]).sum())
    assert float(M.numerical_rank(X * 2.0**-40, atol=8.3 * 2.0**-40)) == float(M.numerical_rank(X, atol=8.3))


def test_three_nearly_parallel_tokens_keep_their_cosine_at_every_scale():
    P = np.array([[1, 1, 1], [1.01, 1, 1], [1.02, 1, 1]])
    U = P / np.linalg.norm(P, axis=1, keepdims=True)
    C = U @ U.T
    expected = (C.sum() - 3) / 6  # float64 reference: 0.9999781
    assert expected == pytest.approx(0.9999781, abs=1e-7)
    X = torch.tensor(P, dtype=torch.float32)
    for s in (1e-37, 1e-25, 1e-10, 1.0, 1e10, 1e20, 1e37):
        assert float(M.avg_abs_cos(X * s)) == pytest.approx(expected, abs=2e-7), s


def _reference_all(X):
    return M.compute_metrics(X, (*INVARIANT, *EQUIVARIANT))


@given(
    seed=st.integers(0, 2**16),
    n=st.integers(2, 9),
    d=st.integers(1, 6),
    exponent=st.integers(-124, 124),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_scaling_by_any_power_of_two_in_the_normal_range_changes_nothing(seed, n, d, exponent, dtype):
    info = torch.finfo(dtype)
    low, high = math.frexp(info.tiny)[1], math.frexp(info.max)[1]
    e = int(np.interp(exponent, [-124, 124], [low + 4, high - 6]))  # keep entries and mu finite
    X = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    smallest = float(X.abs()[X != 0].min()) if bool((X != 0).any()) else 1.0
    e = max(e, math.frexp(info.tiny)[1] - math.frexp(smallest)[1] + 1)  # every scaled entry stays normal: exact
    ref = _reference_all(X)
    got = _reference_all(X * 2.0**e)
    for name in INVARIANT:
        assert torch.equal(got[name], ref[name]), (name, e)
    for name, power in EQUIVARIANT.items():
        value = float(got[name])
        if math.isfinite(value) and abs(value) > info.tiny:  # else the true value is out of range
            assert math.ldexp(value, -power * e) == pytest.approx(float(ref[name]), rel=4 * info.eps), (name, e)


@given(seed=st.integers(0, 2**16), s=st.floats(1e-30, 1e30))
def test_arbitrary_float32_scales_agree_to_rounding(seed, s):
    X = torch.randn(6, 4, generator=torch.Generator().manual_seed(seed))
    ref = M.compute_metrics(X, INVARIANT, dtype=torch.float64)
    got = M.compute_metrics(X * s, INVARIANT, dtype=torch.float64)  # rounding of X*s only
    for name in INVARIANT:
        assert float(got[name]) == pytest.approx(float(ref[name]), rel=1e-5, abs=1e-5), name


def test_simulated_scaled_identity_keeps_avg_abs_cos_near_one():
    from tests.cli._harness import run_cli

    args = ["--value", "scaled_identity:scale=0.01", "--depth", "16", "--metrics", "avg_abs_cos,mu_relative"]
    args += ["--n-tokens", "8", "--d-model", "4", "--n-samples", "1", "--input", "sphere", "--format", "json"]
    out = run_cli("simulate", *args)
    assert out.returncode == 0, out.stderr
    layers = json.loads(out.stdout)["layers"]
    late = [row["avg_abs_cos"] for row in layers if row["layer"] >= 10]
    assert len(late) == 7 and all(v > 0.9999 for v in late)  # float64 gives 1.0; was 0.0 from t = 12
