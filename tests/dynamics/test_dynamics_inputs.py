"""Bad options are ConfigErrors raised before any layer runs; per-layer family lists."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import BlockConfig, RunConfig, simulate
from rankcollapse.dynamics.weights import random_layers
from rankcollapse.errors import ConfigError, MetricError


def X():
    return torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kwargs, match", [
    (dict(run=dict(device="nosuchdevice")), "not a torch device"),
    (dict(run=dict(device="cuda:99")), "not available"),
    (dict(d_qk="1"), "d_qk must be a number"),
    (dict(d_qk=math.inf), "d_qk must be a finite number"),
    (dict(run=dict(seed=-1)), "seed must be an integer >= 0"),
    (dict(run=dict(depth=True)), "depth must be an integer"),
    (dict(run=dict(depth=2.0)), "depth must be an integer"),
    (dict(run=dict(block_size=0)), "block_size"),
    (dict(block=dict(n_heads=True)), "n_heads must be an integer"),
    (dict(value=[object(), object()]), "W_V of layer 0 is not a numeric matrix"),
    (dict(value=[["a", "b"], ["c", "d"]]), "W_V of layer 0"),
    (dict(X0="abc"), "X0 must be a floating-point array, got numpy dtype <U3"),
    (dict(X0=[[1.0], [1.0, 2.0]]), "X0 must be an .N, d. or .B, N, d. array"),
])
def test_bad_options_fail_before_any_layer(kwargs, match):
    calls = []
    metrics = {"n": lambda X: calls.append(1) or X.new_zeros(X.shape[0])}
    args = {"mask": "causal", "metrics": metrics} | kwargs
    with pytest.raises(ConfigError, match=match):
        if isinstance(args.get("block"), dict):
            args["block"] = BlockConfig(**args["block"])
        args["run"] = RunConfig(**{"depth": 2, **args.get("run", {})})
        simulate(args.pop("X0", X()), **args)
    assert calls == []


@pytest.mark.parametrize("kwargs, match", [
    (dict(placement="pre_ln", alpha=math.nan), "alpha must be a finite number"),
    (dict(eps="1e-5"), "eps must be a number"),
    (dict(placement="pre_ln", mlp=True, mlp_ratio=2.5), "mlp_ratio must be an integer"),
    (dict(mlp="yes", placement="pre_ln"), "mlp must be True or False"),
])
def test_block_config_rejects_bad_fields(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        BlockConfig(**kwargs)


def test_numpy_integer_depth_is_accepted():
    res = simulate(X(), mask="causal", run=RunConfig(depth=np.int64(2)))
    assert res.metrics["mu"].shape == (3, 2)


def test_per_layer_list_may_mix_family_specs_and_matrices():
    eye = torch.eye(4, dtype=torch.float64)
    layers = random_layers(4, 2, value=["orthogonal", eye], seed=3)
    assert torch.equal(layers[1].W_V, eye)
    assert torch.equal(layers[0].W_V, random_layers(4, 2, value="orthogonal", seed=3)[0].W_V)


def test_undefined_metric_names_the_layer():
    with pytest.warns(RuntimeWarning, match="zero rows"), pytest.raises(MetricError, match="after layer 1"):
        simulate(X(), mask="causal", value="zero", block="sphere", run=RunConfig(depth=2))


def test_unknown_variant_and_placement_names_are_refused():
    from rankcollapse.dynamics.config import resolve_variant

    with pytest.raises(ConfigError, match="unknown variant 'ln'"):
        resolve_variant("ln")
    with pytest.raises(ConfigError, match="placement must be one of"):
        BlockConfig(placement="theory")


def test_config_records_the_preset_actually_run():
    from rankcollapse.dynamics.config import resolve_variant

    X = torch.randn(2, 5, 3, dtype=torch.float64)
    run = lambda v: simulate(X, mask="causal", block=v, run=RunConfig(depth=2)).config["variant"]  # noqa: E731
    assert run(resolve_variant("sphere", norm="layernorm")) == "layernorm"
    assert run(resolve_variant("post_ln", norm="rmsnorm")) == "custom"


