"""The collapse switch of one layer on almost-simplex tokens: the paper's and the finite-d
critical γ, the switch read off a curve, switch_ratios against the phase sweep's cells (an
independent pipeline), the closed form of exactly equiangular tokens against a direct
computation and its large-N root."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.errors import ConfigError
from rankcollapse.metrics import mu_relative
from rankcollapse.theory.critical import annealed_gamma, paper_gamma, switch
from rankcollapse.theory.temperature import simplex_switch_ratio, switch_ratios


def test_switch_ratios_match_the_phase_sweep(tmp_path):
    """One layer of `phase` (beta=log:γ, simplex, norm=sphere, value=orthogonal, depth 1;
    docs/phase.md, "Temperature against sequence length") gives m(1) with the same m(0)."""
    from rankcollapse.phase import expand_grid, run_phase

    N, d, gamma = 32, 16, 1.5
    fixed = {"d_model": d, "depth": 1, "norm": "sphere", "input": "simplex", "value": "orthogonal", "n_tokens": N}
    table, _ = run_phase(expand_grid({"beta": [f"log:{gamma}"]}, fixed), n_samples=3, cache_dir=tmp_path)
    r = switch_ratios(N, [gamma * math.log(N)], d_model=d, n_samples=3)[:, 0]  # (3,)
    from rankcollapse.phase.cell import make_input

    m0 = mu_relative(make_input("simplex", 3, N, d, 0)).numpy()
    # the sweep reports the geometric mean of m(1) over its inputs
    assert float(table["mu_relative"].iloc[0]) == pytest.approx(float(np.exp(np.log(r * m0).mean())), rel=1e-9)


def test_closed_form_matches_exactly_equiangular_tokens():
    """x_i = sqrt(ρ) e_0 + sqrt(1 - ρ) e_i (d = N + 1): Gram (1 - ρ) I + ρ 11ᵀ exactly."""
    N, rho = 7, 0.3
    X = torch.cat([torch.full((N, 1), math.sqrt(rho), dtype=torch.float64),
                   math.sqrt(1 - rho) * torch.eye(N, dtype=torch.float64)], dim=1)  # (N, N + 1)
    betas = [0.0, 0.4, 2.0, 7.5, 40.0]
    want = []
    for beta in betas:
        y = torch.softmax(beta * (X @ X.T), dim=-1) @ X
        y = y / torch.linalg.vector_norm(y, dim=-1, keepdim=True)
        want.append(float(mu_relative(y) / mu_relative(X)))
    np.testing.assert_allclose(simplex_switch_ratio(N, rho, betas), want, rtol=1e-12, atol=1e-15)


def test_closed_form_root_at_large_n():
    """For N >> 1 and ρ = 1/2, r = 1/2 where e^{β/2} / N = x solves 3x² = x + 1/2 (x = (1 + √7)/6):
    the switch sits at γ* = 2 (1 + ln x / ln N) = 2 - 0.996 / ln N, up to O(1/N)."""
    N = 10**6
    x = (1 + math.sqrt(7)) / 6
    beta = 2 * math.log(x * N)
    assert simplex_switch_ratio(N, 0.5, [beta])[0] == pytest.approx(0.5, abs=5 / math.sqrt(N))
    gammas = np.linspace(1.5, 2.5, 201)
    star = switch(gammas, simplex_switch_ratio(N, 0.5, gammas * math.log(N)))["gamma_switch"]
    assert star == pytest.approx(2 * (1 + math.log(x) / math.log(N)), abs=1e-3)


def test_refusals():
    with pytest.raises(ConfigError, match="rho"):
        simplex_switch_ratio(8, 1.0, [1.0])
    with pytest.raises(ConfigError, match="n_tokens"):
        switch_ratios(1, [1.0])


def test_paper_and_annealed_critical_gamma():
    assert paper_gamma(0.5) == 2.0 and paper_gamma(0.0) == 1.0
    # d -> infinity: the others' weight (N - 1) e^{βρ} M(·) -> (N - 1) e^{βρ}, root -> log(N - 1) / ((1 - ρ) log N)
    n = 4096
    assert annealed_gamma(n, 100_000, 0.5) == pytest.approx(math.log(n - 1) / (0.5 * math.log(n)), rel=2e-3)
    assert annealed_gamma(n, 64, 0.5) > annealed_gamma(n, 256, 0.5) > 2.0 - 1e-3  # finite d: later switch
    assert annealed_gamma(2**16, 8, 0.5) > 3 * annealed_gamma(2**16, 64, 0.5)  # log N >> d: neighbours dominate


def test_switch_interpolates_the_levels():
    s = switch([3.0, 1.0, 2.0, 4.0], [0.7, 0.05, 0.3, 0.95])
    assert s["gamma_switch"] == pytest.approx(2.5)  # 0.3 -> 0.7 between 2 and 3
    assert s["gamma_10"] == pytest.approx(1.2) and s["gamma_90"] == pytest.approx(3.8)
    assert s["width"] == pytest.approx(2.6) and s["slope"] == pytest.approx(0.4)
    assert math.isnan(switch([1.0, 2.0], [0.6, 0.9])["gamma_switch"])  # never below 1/2: not bracketed
