"""simulate's settings in two groups: the layer (BlockConfig) and the run (RunConfig),
with the flat keywords as a shorthand for the run's fields (never both)."""

import inspect

import pytest
import torch

from rankcollapse.dynamics import BlockConfig, RunConfig, simulate
from rankcollapse.errors import ConfigError


def X0():
    return torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_grouped_call_is_the_keyword_call_bit_for_bit():
    kw = simulate(X0(), mask="causal", variant="post_ln", d_qk=2.0, depth=6, seed=3, dtype=torch.float64,
                  backend="blocked", block_size=2, record_states=True, record_epsilon=True)
    grouped = simulate(X0(), mask="causal", d_qk=2.0, block=BlockConfig(norm="layernorm", placement="post_ln"),
                       run=RunConfig(depth=6, seed=3, dtype=torch.float64, backend="blocked", block_size=2,
                                     record_states=True, record_epsilon=True))
    for name in kw.metrics:
        assert torch.equal(kw.metrics[name], grouped.metrics[name])
    assert torch.equal(kw.epsilon_measured, grouped.epsilon_measured)
    assert all(torch.equal(a, b) for a, b in zip(kw.states, grouped.states))
    assert kw.config == grouped.config and grouped.config["variant"] == "post_ln"


@pytest.mark.parametrize("kwargs, match", [
    (dict(run=RunConfig(depth=2), seed=1), "seed given both"),
    (dict(run=RunConfig(depth=2), depth=2, record_states=True), "depth, record_states given both"),
    (dict(), "needs depth"),
    (dict(depth=2, block=BlockConfig(), variant="sphere"), "give the layer once"),
    (dict(depth=2, block="sphere"), "block must be a rankcollapse.dynamics.BlockConfig"),
    (dict(run={"depth": 2}), "run must be a rankcollapse.dynamics.RunConfig"),
])
def test_contradictory_or_missing_settings_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        simulate(X0(), mask="causal", **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(depth=0), "depth must be an integer >= 1"),
    (dict(depth=2, seed=-1), "seed must be an integer >= 0"),
    (dict(depth=2, block_size=0), "block_size"),
    (dict(depth=2, backend="sparse"), "backend must be one of"),
])
def test_run_config_checks_its_fields(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(**kwargs)


def test_signature_shows_the_run_defaults():
    sig = inspect.signature(simulate)
    shown = {name: repr(sig.parameters[name].default) for name in ("seed", "backend", "block_size", "record_states")}
    assert shown == {"seed": "0", "backend": "'auto'", "block_size": "64", "record_states": "False"}
    fields = RunConfig(depth=1)
    assert (fields.seed, fields.backend, fields.block_size, fields.record_states) == (0, "auto", 64, False)
