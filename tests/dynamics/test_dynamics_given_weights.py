"""Given weights (``weights=``, ``simulate --model``) fix every layer's matrices: options
they make meaningless are refused instead of ignored, and the record says what ran."""

import pytest
import torch

from rankcollapse.dynamics import BlockConfig, RunConfig, resolve_variant, simulate
from rankcollapse.dynamics.weights import random_layers
from rankcollapse.errors import ConfigError


def _run(**kw):
    X0 = torch.randn(1, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    weights = random_layers(8, 2, n_heads=4, out_proj=True, seed=1)
    return simulate(X0, mask="causal", weights=weights, run=RunConfig(depth=2, dtype=torch.float64), **kw), X0, weights


@pytest.mark.parametrize("kw, name", [
    (dict(value="orthogonal"), "value"),
    (dict(query_key="zero"), "query_key"),
    (dict(value=torch.eye(8)), "value"),
    (dict(shared=True), "shared"),
])
def test_options_the_weights_override_are_refused(kw, name):
    with pytest.raises(ConfigError, match=f"{name} would be ignored"):
        _run(**kw)


def test_a_head_count_other_than_the_weights_is_refused():
    with pytest.raises(ConfigError, match="n_heads=2 but the given weights have 4 heads"):
        _run(block=BlockConfig(n_heads=2))
    with pytest.raises(ConfigError, match="n_heads=2 but"):
        _run(block=resolve_variant("skip", n_heads=2))


def test_the_record_gives_the_heads_and_projection_that_ran():
    res, X0, weights = _run()
    block = res.config["block"]
    assert (block["n_heads"], block["out_proj"]) == (4, True)
    assert res.config["value"] == res.config["query_key"] == res.config["weights"] == "given"
    assert res.config["variant"] == "pure"  # the update rule; the head layout is in "block"
    # the same numbers as the run that draws those weights itself (same seed, same layout)
    drawn = simulate(X0, mask="causal", block=BlockConfig(n_heads=4, out_proj=True),
                     run=RunConfig(depth=2, seed=1, dtype=torch.float64))
    assert torch.equal(drawn.metrics["mu"], res.metrics["mu"])
    assert drawn.config["block"] == block
