"""The round-off floor model (rankcollapse.metrics.floor): its closed form, and that
exactly collapsed float64 trajectories of the simulator read below it."""

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.metrics.floor import EPS64, epsilon, gap_floor, mu_floor, relative_floor


def test_closed_forms():
    assert mu_floor(32, 16) == 96 * EPS64
    assert mu_floor(32, 16, "float32") == 96 * float(np.finfo(np.float32).eps)
    assert gap_floor(16, 8) == (8 + 256) * EPS64 / 2
    assert relative_floor("float64") == mu_floor(8192, 576) and relative_floor("float64", 128, 384) == 1024 * EPS64
    assert epsilon("float64") == EPS64 and epsilon("not a dtype") == 0.0 and relative_floor("unknown") == 0.0


@pytest.mark.parametrize("variant", ["pure", "layernorm", "post_ln"])
@pytest.mark.parametrize("mask", ["complete", "causal"])
def test_an_exactly_collapsed_trajectory_stays_within_the_floor(variant, mask):
    """X0 = 1 x^T is collapsed in exact arithmetic at every layer: every computed value of
    mu/||X||_F is round-off, and the model bounds it (benchmarks/floor_calibration.py runs
    the full grid; the margin there is >= 20)."""
    n, d = 64, 16
    x = torch.randn(d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    r = simulate(x.expand(1, n, d).clone(), mask=mask, metrics=("mu_relative",), block=variant,
                 run=RunConfig(depth=16, seed=0, dtype=torch.float64))
    m = r.metrics["mu_relative"].numpy()
    assert np.isfinite(m).all() and m.max() <= mu_floor(n, d)


def test_one_floor_model_for_claims_and_phase():
    from rankcollapse.experiments import quantities
    from rankcollapse.phase import regime

    assert regime.mu_floor is mu_floor and regime.gap_floor is gap_floor
    assert quantities.relative_floor is relative_floor
