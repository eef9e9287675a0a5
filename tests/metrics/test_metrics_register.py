"""register_metric: the public way to add a metric (refuses duplicates, checks what the
registry needs), and the registered metric reaches every consumer by name."""

import re

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.errors import MetricError, RankCollapseError
from rankcollapse.metrics import METRICS, MetricSpec, compute_metrics, register_metric, report_metrics


@pytest.fixture
def registry():
    """Names registered by a test are removed after it."""
    before = set(METRICS)
    yield METRICS
    for name in set(METRICS) - before:
        del METRICS[name]


def sigma_1(ctx):
    return ctx.svals[..., 0] * ctx.scale


def edge_sum(ctx):  # sum over allowed pairs of x_i . x_j, a mask-dependent toy metric
    G = ctx.X @ ctx.X.transpose(-1, -2)
    return (G * ctx.graph.to(G.dtype)).sum((-1, -2)) * ctx.scale**2


def test_registered_metric_matches_numpy_and_reaches_every_consumer(registry):
    spec = register_metric("sigma_1", sigma_1, "largest singular value", collapse_value=None)
    assert isinstance(spec, MetricSpec) and METRICS["sigma_1"] is spec
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3, 7, 4)) * 1e30  # scaled: ctx.X is normalised, the value is not
    got = compute_metrics(torch.from_numpy(X), ["sigma_1"])["sigma_1"].numpy()
    want = np.linalg.svd(X, compute_uv=False)[:, 0]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert report_metrics(X[0], ["sigma_1"]).values["sigma_1"] == pytest.approx(want[0], rel=1e-12)
    res = simulate(torch.from_numpy(X) / 1e30, mask="causal", metrics=["sigma_1"], run=RunConfig(depth=2))
    assert res.metrics["sigma_1"].shape == (3, 3)


def test_a_mask_metric_sees_the_mask_in_simulate(registry):
    register_metric("edge_sum", edge_sum, "sum_{M[i,j]} x_i . x_j", uses_mask=True)
    X = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    res = simulate(X, mask="causal", metrics=["edge_sum"], run=RunConfig(depth=1))
    tril = torch.ones(5, 5, dtype=torch.bool).tril()
    want = ((X @ X.transpose(1, 2)) * tril).sum((1, 2))
    torch.testing.assert_close(res.metrics["edge_sum"][0], want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", ["mu", "attention_entropy"])
def test_a_taken_name_is_refused(registry, name):
    with pytest.raises(MetricError, match=f"'{name}' is already registered"):
        register_metric(name, sigma_1, "again")
    assert issubclass(MetricError, RankCollapseError)


def test_registering_twice_is_refused_and_the_first_entry_stays(registry):
    first = register_metric("sigma_1", sigma_1, "largest singular value")
    with pytest.raises(MetricError, match="already registered"):
        register_metric("sigma_1", edge_sum, "other")
    assert METRICS["sigma_1"] is first


@pytest.mark.parametrize("kwargs, text", [
    ({"name": "Sigma1"}, "lower-case identifier"),
    ({"name": "a,b"}, "lower-case identifier"),
    ({"name": ""}, "lower-case identifier"),
    ({"name": 3}, "lower-case identifier"),
    ({"fn": "svd"}, "callable"),
    ({"fn": lambda: 0}, "only argument"),
    ({"fn": lambda ctx, other: 0}, "only argument"),
    ({"description": ""}, "one non-empty line"),
    ({"description": "two\nlines"}, "one non-empty line"),
    ({"collapse_value": float("nan")}, "finite number"),
    ({"collapse_value": "0"}, "finite number"),
    ({"collapse_value": True}, "finite number"),
    ({"uses_mask": "yes"}, "True or False"),
])
def test_bad_registrations_are_refused(registry, kwargs, text):
    args = {"name": "ok_name", "fn": sigma_1, "description": "largest singular value", **kwargs}
    name, fn, description = args.pop("name"), args.pop("fn"), args.pop("description")
    with pytest.raises(MetricError, match=text):
        register_metric(name, fn, description, **args)
    assert "ok_name" not in METRICS


def test_optional_context_arguments_are_accepted(registry):
    register_metric("sigma_1_kw", lambda ctx, *, unused=None: sigma_1(ctx), "largest singular value",
                    collapse_value=0)
    assert METRICS["sigma_1_kw"].collapse_value == 0.0


@pytest.mark.parametrize("fn, got", [
    (lambda ctx: ctx.svals[..., 0].sum(), "shape ()"),         # one value for the whole group
    (lambda ctx: ctx.X.norm(dim=-1), "shape (3, 5)"),          # one value per token
    (lambda ctx: 1.0, "float"),
])
def test_a_registered_metric_of_the_wrong_shape_is_a_metric_error(registry, fn, got):
    register_metric("bad_shape", fn, "a metric that breaks the contract")
    X = np.random.default_rng(0).normal(size=(3, 5, 4))
    with pytest.raises(MetricError, match=rf"metric 'bad_shape' returned .*{re.escape(got)}.*shape \(3,\)"):
        compute_metrics(X, ["bad_shape"])
