"""The first token's attention mass of phase cells (``sink_mass``, ``sink_mass_uniform``):
hand-built values, uniform attention, the reference path against the sweep's, and a sink
that forms through the dynamics (docs/phase.md, "Head-wise RMSNorm and the sink")."""

from __future__ import annotations

import pytest
import torch

from rankcollapse.masks import parse_mask
from rankcollapse.phase.batched import run_group
from rankcollapse.phase.cell import run_cell, sink_mass, uniform_sink_mass
from rankcollapse.phase.grid import expand_grid


def test_sink_mass_of_hand_built_attention():
    N = 6
    on_first = torch.zeros(N, N, dtype=torch.float64)
    on_first[:, 0] = 1.0  # one key per row, the first token
    assert float(sink_mass(on_first)) == 1.0
    assert float(sink_mass(torch.eye(N, dtype=torch.float64))) == 0.0  # each query on itself
    A = torch.stack([on_first, torch.full((N, N), 1.0 / N, dtype=torch.float64)])  # (2, N, N) -> (2,)
    assert sink_mass(A).tolist() == pytest.approx([1.0, 1.0 / N], rel=1e-15)
    assert torch.isnan(sink_mass(torch.ones(3, 1, 1, dtype=torch.float64))).all()  # N = 1: no query besides it


@pytest.mark.parametrize("spec, closed_form", [
    ("causal", lambda N: (sum(1.0 / i for i in range(1, N + 1)) - 1.0) / (N - 1)),  # (H_N - 1) / (N - 1)
    ("complete", lambda N: 1.0 / N),
    ("sliding_window:w=3", None),
])
def test_uniform_reference_is_the_mean_over_queries_of_one_over_their_keys(spec, closed_form):
    N = 16
    allowed = parse_mask(spec, N).to_dense()
    keys = allowed.sum(-1)
    direct = sum(float(allowed[i, 0]) / int(keys[i]) for i in range(1, N)) / (N - 1)
    assert uniform_sink_mass(allowed) == pytest.approx(direct, rel=1e-14)
    if closed_form is not None:
        assert uniform_sink_mass(allowed) == pytest.approx(closed_form(N), rel=1e-14)


def _cell(**over):
    fixed = {"n_tokens": 32, "d_model": 16, "depth": 24, "mask": "causal", "input": "gaussian", **over}
    return expand_grid({}, fixed)[0]


def test_uniform_attention_reads_the_uniform_reference_and_paths_agree():
    c = _cell(qk_scale=0.0, norm="rmsnorm", placement="pre_ln", depth=6)  # W_Q = W_K = 0: uniform rows
    (row,) = run_group([c], n_samples=2)
    assert row["sink_mass_uniform"] == pytest.approx((sum(1.0 / i for i in range(1, 33)) - 1.0) / 31, rel=1e-14)
    assert row["sink_mass"] == pytest.approx(row["sink_mass_uniform"], rel=1e-12)
    c = _cell(norm="none", placement="pre_ln", depth=6)
    got, ref = run_group([c], n_samples=2)[0], run_cell(c, n_samples=2)
    assert got["sink_mass"] == pytest.approx(ref["sink_mass"], rel=1e-9)
    assert got["sink_mass_uniform"] == ref["sink_mass_uniform"]


def test_a_sink_forms_in_the_plain_residual_and_not_under_a_norm():
    """X <- X + SA(X) with one layer's weights for all layers (causal, Gaussian input and
    weights): the first token's mass at the last layer is 4.7x the uniform row's; the same
    cells under pre-LN RMSNorm (no sink expected) read the uniform row to 10%."""
    plain, normed = (run_group([_cell(norm=n, placement="pre_ln", shared=True)], n_samples=8, seeds=2)[0]
                     for n in ("none", "rmsnorm"))
    assert plain["sink_mass"] >= 3 * plain["sink_mass_uniform"]
    assert normed["sink_mass"] == pytest.approx(normed["sink_mass_uniform"], rel=0.25)
