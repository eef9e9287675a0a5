"""simulate's settings in two groups: the network (``block``: a BlockConfig or a preset
name) and the run (``run``: a RunConfig), each given once."""

import inspect

import pytest
import torch

from rankcollapse.dynamics import BlockConfig, RunConfig, simulate
from rankcollapse.errors import ConfigError


def X0():
    return torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_preset_name_is_its_block_bit_for_bit():
    run = RunConfig(depth=6, seed=3, dtype=torch.float64, backend="blocked", block_size=2, record_states=True,
                    record_epsilon=True)
    kw = simulate(X0(), "causal", d_qk=2.0, block="post_ln", run=run)
    grouped = simulate(X0(), "causal", d_qk=2.0, block=BlockConfig(norm="layernorm", placement="post_ln"), run=run)
    for name in kw.metrics:
        assert torch.equal(kw.metrics[name], grouped.metrics[name])
    assert torch.equal(kw.epsilon_measured, grouped.epsilon_measured)
    assert all(torch.equal(a, b) for a, b in zip(kw.states, grouped.states))
    assert kw.config == grouped.config and grouped.config["variant"] == "post_ln"


@pytest.mark.parametrize("kwargs, match", [
    (dict(run={"depth": 2}), "run must be a rankcollapse.dynamics.RunConfig"),
    (dict(run=RunConfig(depth=2), block="nope"), "unknown variant 'nope'"),
    (dict(run=RunConfig(depth=2), shared="no"), "shared must be True or False"),  # a truthy string would share
])
def test_bad_groups_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        simulate(X0(), mask="causal", **kwargs)


@pytest.mark.parametrize("name", ["depth", "seed", "dtype", "backend", "variant", "n_heads"])
def test_each_setting_has_one_place(name):
    params = inspect.signature(simulate).parameters
    assert name not in params
    with pytest.raises(TypeError, match=name):
        simulate(X0(), mask="causal", run=RunConfig(depth=1), **{name: None})


@pytest.mark.parametrize("kwargs, match", [
    (dict(depth=0), "depth must be an integer >= 1"),
    (dict(depth=2, seed=-1), "seed must be an integer >= 0"),
    (dict(depth=2, block_size=0), "block_size"),
    (dict(depth=2, backend="sparse"), "backend must be one of"),
])
def test_run_config_checks_its_fields(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(**kwargs)


def test_run_defaults():
    fields = RunConfig(depth=1)
    assert (fields.seed, fields.backend, fields.block_size, fields.record_states) == (0, "auto", 64, False)
