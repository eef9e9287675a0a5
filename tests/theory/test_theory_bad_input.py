"""Bad input to the theory checks: clear errors naming what was wrong, never a silently
wrong number; and portraits that describe the system they draw."""

import time

import numpy as np
import pytest
import torch

from rankcollapse.errors import ConfigError, ConvergenceError, MemoryLimitError
from rankcollapse.theory.basin import basin_estimate
from rankcollapse.theory.bound import check_collapse_bound
from rankcollapse.theory.clusters import circle_clusters
from rankcollapse.theory.equilibria import equilibria
from rankcollapse.theory.sphere import check_sphere_collapse
from rankcollapse.theory.equilibria import find_equilibria
from rankcollapse.theory.basin import portrait_2d, trajectories_3d
from rankcollapse.theory.system import causal_uniform_system

ZERO_V = causal_uniform_system(torch.zeros(2, 2, dtype=torch.float64), 2)
ROTATION_V = causal_uniform_system(torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64), 2)


@pytest.mark.parametrize(
    "kw, text",
    [
        (dict(mask="causal", n_tokens=1), "at least 2 tokens"),
        (dict(mask="causal", n_tokens=8, depth=0), "depth"),
        (dict(mask="causal", n_tokens=8, n_samples=0), "n_samples"),
        (dict(mask="causal", n_tokens=8, d_model=0), "d_model ≥ 1"),
    ],
)
def test_bound_rejects_degenerate_settings(kw, text):
    with pytest.raises(ConfigError, match=text):
        check_collapse_bound(**kw)


@pytest.mark.parametrize("confidence", [0.0, 1.0, 1.5, float("nan")])
def test_basin_confidence_out_of_range(confidence):
    with pytest.raises(ConfigError, match="confidence"):
        basin_estimate(n_samples=10, depth=5, confidence=confidence)


@pytest.mark.parametrize("call, text", [
    (lambda: basin_estimate(n_samples=10**12, depth=5), "1000000000000 SA-LN starts of N = 2, d = 2 needs about"),
    (lambda: equilibria(10**6, 4, 1), "the equilibria of N = 1000000, d = 4 with their stability needs about"),
    (lambda: equilibria(2, 10**6, 1, stability=False), "the equilibria of N = 2, d = 1000000 needs about"),
    (lambda: check_sphere_collapse("causal", n_tokens=16, depth=10**12),
     "the sphere check of 8 x 16 x 8 tokens over 1000000000000 layers"),
    (lambda: check_collapse_bound(mask="causal", n_tokens=8, n_samples=10**12),
     "drawing 1000000000000 x 8 x 16 input tokens"),
])
def test_a_size_beyond_memory_is_refused_before_allocating(call, text):
    """Sizes far beyond any machine's memory: refused in a fraction of a second with the
    estimate, not killed by the allocator (or an internal RuntimeError) minutes later."""
    t0 = time.process_time()
    with pytest.raises(MemoryLimitError, match=text):
        call()
    assert time.process_time() - t0 < 2


def test_basin_undefined_step_is_reported():
    with pytest.raises(ConfigError, match="undefined"):
        basin_estimate(ZERO_V, n_samples=10, depth=5)


def test_basin_with_no_converged_start_raises():
    # A rotation by 90 degrees never settles: a fraction 0 of converged starts would be a silent lie.
    with pytest.raises(ConvergenceError, match="10 starts"):
        basin_estimate(ROTATION_V, n_samples=10, depth=50)


def test_finder_names_an_undefined_step():
    with pytest.raises(ConfigError, match="zero before normalisation"):
        find_equilibria(ZERO_V, n_starts=4, fixed_point_iters=5, newton_iters=2)


def test_portrait_2d_describes_the_system_it_draws(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    system = causal_uniform_system(torch.tensor([[0.5, 0.0], [0.0, 2.0]], dtype=torch.float64), 2)
    captured = {}
    orig = plt.Figure.savefig

    def spy(fig, *a, **k):
        ax = fig.axes[0]
        captured["title"] = ax.get_title()
        captured["lines"] = sorted(round(float(line.get_ydata()[0]), 6) for line in ax.get_lines())
        return orig(fig, *a, **k)

    plt.Figure.savefig = spy
    try:
        data = portrait_2d(tmp_path / "p.png", system=system, n_angles=61, depth=200)
    finally:
        plt.Figure.savefig = orig
    assert "0.5" in captured["title"] and "-3" not in captured["title"]
    finals = np.concatenate([data["final_deg"][1], data["final_deg"][-1]])
    for y in captured["lines"]:  # every reference line is a final angle actually reached
        assert np.isclose(finals, y, atol=1e-3).any()


def test_trajectories_3d_default_shows_a_rank_2_end(tmp_path):
    traj = trajectories_3d(tmp_path / "t.png")
    ranks = [np.linalg.matrix_rank(x, tol=1e-6) for x in traj[-1]]
    assert 2 in ranks and 1 in ranks


@pytest.mark.parametrize("kw", [dict(n_tokens=1), dict(n_tokens=4, d_model=1), dict(n_tokens=4, depth=0), dict(n_tokens=4, beta=-1.0)])
def test_sphere_check_rejects_degenerate_settings(kw):
    from rankcollapse.theory.sphere import check_sphere_collapse

    with pytest.raises(ConfigError, match="need N ≥ 2"):
        check_sphere_collapse("causal", **kw)


@pytest.mark.parametrize("mu", [torch.empty(0), torch.empty(0, 3), torch.ones(1, 3), torch.ones(5, 0), torch.ones(4)])
def test_fit_rate_refuses_series_without_a_slope(mu):
    """An empty series, one layer or no sample has no rate: a ConfigError, never a
    RuntimeError or a rate of 1."""
    from rankcollapse.theory import fit_rate

    with pytest.raises(ConfigError, match="T >= 2"):
        fit_rate(mu)


def test_fit_rate_of_a_geometric_series():
    from rankcollapse.theory import fit_rate

    mu = torch.tensor([0.5, 0.25]).double().pow(torch.arange(6.0).double().unsqueeze(1))  # (6, 2)
    torch.testing.assert_close(fit_rate(mu), torch.tensor([0.5, 0.25], dtype=torch.float64))


def test_analyses_of_a_system_refuse_what_is_not_a_system_or_its_state():
    import torch

    from rankcollapse.errors import ConfigError
    from rankcollapse.theory import find_equilibria, jacobian, stability, tangent_basis
    from rankcollapse.theory.equilibria import causal_example_2x2

    system = causal_example_2x2().system
    X = torch.eye(2, dtype=torch.float64)
    for call, text in ((lambda: find_equilibria(None), "system must be an AttentionSystem"),
                       (lambda: jacobian(system, None), "X must be a real tensor"),
                       (lambda: stability(system, torch.ones(3, 2)), r"the system's states are \(N, d\) = \(2, 2\)"),
                       (lambda: tangent_basis(None), "X must be a real tensor")):
        with pytest.raises(ConfigError, match=text):
            call()
    assert jacobian(system, X.numpy()).shape == (4, 4)  # an array is a state too


def test_a_system_is_built_from_tensors_only():
    from rankcollapse.theory import AttentionSystem

    with pytest.raises(ConfigError, match="mask must be a torch.Tensor"):
        AttentionSystem(None, None, None, None)
    with pytest.raises(ConfigError, match="W_V must be a"):
        causal_uniform_system(None, 3)
    with pytest.raises(ConfigError, match="n_tokens must be an integer"):
        causal_uniform_system(torch.eye(2), 0)


def test_envelope_depth_and_plateaus_refuse_non_numbers():
    from rankcollapse.theory import envelope_crossing_depth, first_plateau, plateaus

    for call in (lambda: envelope_crossing_depth("causal", None, 8), lambda: envelope_crossing_depth("causal", 0.5, 8, cap=None),
                 lambda: plateaus(None), lambda: first_plateau(["a"])):
        with pytest.raises(ConfigError):
            call()
    assert plateaus([2, 2, 1]) == [(2, 0, 2), (1, 2, 1)]


@pytest.mark.parametrize("run", [
    lambda seed: basin_estimate(n_samples=2, depth=2, seed=seed),
    lambda seed: trajectories_3d(n_starts=1, depth=2, seed=seed),
    lambda seed: check_sphere_collapse("causal", n_tokens=4, depth=2, n_samples=1, seed=seed),
    lambda seed: find_equilibria(ROTATION_V, n_starts=1, seed=seed),
    lambda seed: circle_clusters(2.0, n_tokens=4, n_samples=1, depth=2, min_plateau=1, seed=seed),
], ids=["basin", "trajectories_3d", "sphere", "find", "clusters"])
def test_a_negative_seed_is_refused_as_everywhere(run):
    with pytest.raises(ConfigError, match="seed must be an integer >= 0, got -1"):
        run(-1)
