"""Progress bars: one step per layer / batch; nothing written off a terminal."""

import torch

from rankcollapse import dynamics, theory
from rankcollapse._progress import steps


def test_steps_count_and_quiet_off_terminal(capfd):
    with steps(5, "x") as bar:  # stderr under pytest is not a terminal
        for _ in range(5):
            bar.advance()
    assert bar.completed == 5
    assert capfd.readouterr().err == ""


def test_simulate_and_basin_are_quiet_off_a_terminal_and_same_with_a_bar(capfd):
    X0 = dynamics.gaussian_tokens(2, 5, 3, seed=0)
    quiet = dynamics.simulate(X0, mask="causal", run=dynamics.RunConfig(depth=3))
    assert capfd.readouterr().err == ""
    shown = dynamics.simulate(X0, mask="causal", run=dynamics.RunConfig(depth=3, progress=True))
    assert torch.equal(quiet.metrics["mu"], shown.metrics["mu"])
    b0 = theory.basin_estimate(n_samples=40, depth=200, seed=1)
    assert capfd.readouterr().err.count("Traceback") == 0
    b1 = theory.basin_estimate(n_samples=40, depth=200, seed=1, progress=True)
    assert b0.n_hits == b1.n_hits
