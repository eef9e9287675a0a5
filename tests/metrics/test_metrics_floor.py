"""The round-off floor model (rankcollapse.metrics.floor): its closed form, and that
exactly collapsed float64 trajectories of the simulator read below it."""

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.metrics.floor import EPS64, epsilon, gap_floor, mark_floor, mu_floor, relative_floor


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


def test_mark_floor_on_hand_built_rows():
    """float32 at N = 16, d = 8: the floor is 2 (16 + 8) eps; a scale-free metric at or
    below it and a norm below the smallest normal number are marked, nothing else."""
    floor = 2 * (16 + 8) * float(np.finfo(np.float32).eps)
    tiny = float(np.finfo(np.float32).tiny)
    rows = [{"mu_relative": floor, "mu": tiny / 2, "token_radius": None, "avg_abs_cos": 0.0},
            {"mu_relative": 2 * floor, "mu": 0.0, "token_radius": 2 * tiny, "avg_abs_cos": 0.0}]
    desc = mark_floor(rows, ["mu_relative", "mu", "token_radius", "avg_abs_cos"], "float32", 16, 8)
    assert [row["at_floor"] for row in rows] == [["mu_relative", "mu"], []]
    assert desc["floor"] == pytest.approx(floor, rel=1e-12) and desc["smallest_normal"] == tiny
    assert desc["metrics"] == ["mu_relative"] and desc["underflow_metrics"] == ["mu", "token_radius"]
