"""The schedule envelope (docs/theory.md §7) is never crossed, and its support claim holds."""

import json

import numpy as np
import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.masks.schedule import parse_schedule
from rankcollapse.theory import check_collapse_bound, check_schedule_bound
from tests.cli._harness import run_cli

_LAYERS = ["causal_sliding_window:w=2", "causal_sliding_window:w=3", "causal", "sliding_window:w=3",
           "complete", "random:p=0.1,seed=4"]


@pytest.mark.parametrize("draw", range(6))
def test_envelope_never_crossed_on_random_schedules(draw):
    rng = np.random.default_rng(draw)
    k = int(rng.integers(1, 4))
    items = [f"{_LAYERS[i]}*{int(rng.integers(1, 4))}" for i in rng.integers(0, len(_LAYERS), k)]
    spec = "schedule:" + ",".join(items)
    n = int(rng.integers(6, 20))
    try:
        res = check_schedule_bound(spec, n_tokens=n, d_model=8, depth=40, n_samples=4, seed=draw,
                                   qk_scale=float(rng.choice([1.0, 3.0])))
    except ConfigError as exc:  # composed graph not QSC: the theorem does not apply
        assert "quasi-strongly" in str(exc)
        return
    assert res.n_violations == 0 and res.holds
    assert res.config["support_agrees"] is True
    assert res.config["period"] == parse_schedule(spec, n).period
    assert (res.mu <= res.envelope * (1 + 1e-9)).all()


def test_check_collapse_bound_dispatches_and_period_one_is_theorem_1():
    a = check_collapse_bound("causal_sliding_window:w=3", n_tokens=12, depth=20, n_samples=3)
    b = check_collapse_bound("schedule:causal_sliding_window:w=3", n_tokens=12, depth=20, n_samples=3)
    assert b.config["period"] == 1 and b.radius == a.radius
    np.testing.assert_allclose(b.envelope.numpy(), a.envelope.numpy(), rtol=1e-12)
    np.testing.assert_array_equal(b.mu.numpy(), a.mu.numpy())


def test_schedule_without_self_loops_or_qsc_is_rejected():
    with pytest.raises(ConfigError, match="quasi-strongly"):
        check_schedule_bound("schedule:block:size=4*2", n_tokens=8, depth=4)


def test_theory_bound_cli_takes_a_schedule():
    p = run_cli("theory", "bound", "--n-tokens", "16", "--mask", "schedule:causal_sliding_window:w=3*2,causal",
                "--depth", "20", "--n-samples", "3", "--format", "json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["n_violations"] == 0 and d["config"]["period"] == 3 and d["config"]["support_agrees"]
