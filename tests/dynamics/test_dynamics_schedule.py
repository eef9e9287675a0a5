"""Per-layer masks in simulate: layer t attends through the schedule's mask t mod period."""

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import RunConfig, gaussian_tokens, simulate
from rankcollapse.masks import parse_mask
from rankcollapse.masks.schedule import parse_schedule
from tests.cli._harness import run_cli


def test_each_layer_uses_its_mask():
    spec = "schedule:causal_sliding_window:w=3*2,causal"
    X0 = gaussian_tokens(2, 10, 8, seed=1)
    res = simulate(X0, mask=spec, run=RunConfig(depth=7, record_attention=True, record_epsilon=True, dtype=torch.float64))
    sched = parse_schedule(spec, 10)
    for t, A in enumerate(res.attention):
        assert torch.equal(A[0, 0] > 0, sched.layer(t).to_dense())
        assert torch.allclose(A.sum(-1), torch.ones(()).double())
    assert res.epsilon_measured.shape == (7,) and res.config["mask"] == spec


def test_schedule_matches_a_numpy_reference():
    spec = "schedule:sliding_window:w=3,complete"
    X0 = gaussian_tokens(1, 6, 4, seed=2).double()
    res = simulate(X0, mask=spec, value="orthogonal",
                   run=RunConfig(depth=4, record_states=True, dtype=torch.float64, seed=3, record_attention=True))
    # replay: X(t+1) = A(t) X(t) W_V(t); A(t) from the recorded attention, support checked against the mask
    masks = [parse_mask("sliding_window:w=3", 6).to_dense().numpy(), np.ones((6, 6), bool)]
    for t in range(4):
        A = res.attention[t][0, 0].numpy()
        assert np.array_equal(A > 0, masks[t % 2])
    # period-1 schedule = the plain mask, bit for bit
    a = simulate(X0, mask="schedule:causal", run=RunConfig(depth=3, seed=5, dtype=torch.float64)).metrics["mu"]
    b = simulate(X0, mask="causal", run=RunConfig(depth=3, seed=5, dtype=torch.float64)).metrics["mu"]
    assert torch.equal(a, b)


def test_blocked_path_agrees_with_dense():
    spec = "schedule:causal_sliding_window:w=4*3,causal"
    X0 = gaussian_tokens(2, 40, 8, seed=0).double()
    d = simulate(X0, mask=spec, run=RunConfig(depth=8, backend="dense", dtype=torch.float64)).metrics["mu"]
    b = simulate(X0, mask=spec, run=RunConfig(depth=8, backend="blocked", block_size=16, dtype=torch.float64)).metrics["mu"]
    torch.testing.assert_close(d, b, rtol=1e-9, atol=1e-12)


def test_simulate_cli_takes_a_schedule(tmp_path):
    p = run_cli("simulate", "--mask", "schedule:causal_sliding_window:w=3*2,causal", "--n-tokens", "12", "--depth", "4",
                "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    p = run_cli("simulate", "--mask", "schedule:causal*0", "--n-tokens", "12", "--depth", "4",
                "--out", str(tmp_path / "o2"))
    assert p.returncode == 2 and "repeat" in p.stderr
