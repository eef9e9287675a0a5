"""interaction_energy: E_beta = (1 / 2 beta) sum_{i,j} exp(beta <u_i, u_j>) on the unit tokens,
against its closed forms, a plain numpy sum, padding and the log-space sum."""

import math
import warnings

import numpy as np
import pytest
import torch

import metrics_numpy_reference as ref
from rankcollapse.errors import MetricError
from rankcollapse.metrics import ZeroRowWarning, compute_metrics, interaction_energy


@pytest.mark.parametrize("beta", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("N", [1, 2, 7])
def test_all_tokens_equal(N, beta):
    """Every pair has cosine 1: E = N^2 e^beta / 2 beta, whatever the common norm."""
    X = torch.tensor([[3.0, -1.0, 2.0]], dtype=torch.float64).repeat(N, 1) * torch.arange(1, N + 1).unsqueeze(1)
    assert float(interaction_energy(X, beta=beta)) == pytest.approx(N**2 * math.exp(beta) / (2 * beta), rel=1e-13)


@pytest.mark.parametrize("beta", [0.5, 1.0, 3.0])
def test_orthonormal_tokens(beta):
    """N = d orthonormal rows (scaled): E = (N e^beta + N (N - 1)) / 2 beta."""
    N = 6
    Q, _ = torch.linalg.qr(torch.randn(N, N, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    X = Q * torch.linspace(0.1, 10.0, N, dtype=torch.float64).unsqueeze(1)
    want = (N * math.exp(beta) + N * (N - 1)) / (2 * beta)
    assert float(interaction_energy(X, beta=beta)) == pytest.approx(want, rel=1e-13)


def test_registry_name_is_beta_one_and_matches_numpy():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((2, 9, 5)) * 40.0
    got = compute_metrics(torch.from_numpy(X), ["interaction_energy"])["interaction_energy"]
    for b in range(2):
        assert float(got[b]) == pytest.approx(ref.interaction_energy(X[b], beta=1.0), rel=1e-12)
        assert float(interaction_energy(X[b], beta=2.5)) == pytest.approx(ref.interaction_energy(X[b], beta=2.5),
                                                                           rel=1e-12)


def test_padding_is_left_out():
    """A padded sample gives the energy of its real rows alone (its N, not the padded N)."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((2, 8, 4))
    pm = np.ones((2, 8), dtype=bool)
    pm[1, 5:] = False
    X[1, 5:] = 1e6  # garbage in the padded rows
    got = compute_metrics(X, ["interaction_energy"], padding_mask=pm)["interaction_energy"]
    assert float(got[0]) == pytest.approx(ref.interaction_energy(X[0]), rel=1e-12)
    assert float(got[1]) == pytest.approx(ref.interaction_energy(X[1, :5]), rel=1e-12)


def test_zero_tokens_have_no_direction():
    X = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    with pytest.warns(ZeroRowWarning):
        got = float(compute_metrics(X, ["interaction_energy"])["interaction_energy"])
    assert got == pytest.approx((2 * math.e + 2) / 2, rel=1e-13)  # two orthonormal directions


def test_log_space_sum_stays_finite_where_the_terms_overflow():
    """float32, 128 equal tokens, beta = 80: each term e^80 ~ 5.5e34 is finite but their
    sum (~9e38) is not; E = 128^2 e^80 / 160 ~ 5.7e36 is, and the log-space sum gives it."""
    X = torch.ones(128, 4)
    got = interaction_energy(X, beta=80.0)
    assert got.dtype == torch.float32
    assert float(got) == pytest.approx(128**2 * math.exp(80.0) / 160.0, rel=1e-4)
    assert not torch.isfinite(torch.exp(80.0 * (X @ X.T / 4.0)).sum())


def test_energy_beyond_the_dtype_is_refused():
    with pytest.raises(MetricError, match=r"log E_beta.*: use float64 or a smaller beta$"):
        interaction_energy(torch.ones(8, 3), beta=100.0)
    with pytest.raises(MetricError, match=r"float64 \(log E_beta.*: use a smaller beta$"):  # float64 already
        interaction_energy(torch.ones(8, 3, dtype=torch.float64), beta=1000.0)


@pytest.mark.parametrize("beta", [0.0, -1.0, math.inf, True])
def test_bad_beta(beta):
    with pytest.raises(MetricError, match="beta"):
        interaction_energy(torch.ones(3, 2), beta=beta)


def test_energy_rises_as_tokens_gather():
    """Unit tokens in a plane at angles spread over [-t, t]: every pair's cosine grows as t
    shrinks, so E grows strictly (the monotone curve of the energy claims' negative control)."""
    energies = []
    for t in (1.0, 0.5, 0.25, 0.125):
        a = np.linspace(-t, t, 16)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            energies.append(float(interaction_energy(np.stack([np.cos(a), np.sin(a)], axis=1))))
    assert all(b > a for a, b in zip(energies, energies[1:]))
    assert energies[-1] < 16**2 * math.e / 2
