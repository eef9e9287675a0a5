"""A post-LN or pre-LN block has its residual unless the user turns it off: the name
``post_ln`` means one block whether it comes from the string preset or from
``BlockConfig(placement="post_ln")``, and every record says which block ran."""

import json

import pytest
import torch

from rankcollapse.dynamics import BlockConfig, LayerWeights, RunConfig, simulate
from rankcollapse.dynamics.config import VARIANTS, resolve_variant, variant_name
from rankcollapse.errors import ConfigError
from tests.cli._harness import run_cli


def _tokens(B=2, N=6, d=4, seed=0):
    return torch.randn(B, N, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("placement, alpha", [("none", 0.0), ("post_ln", 1.0), ("pre_ln", 1.0)])
def test_default_skip_weight_follows_the_placement(placement, alpha):
    assert BlockConfig(placement=placement).alpha == alpha
    assert BlockConfig(placement=placement).to_dict()["alpha"] == alpha


def test_the_residual_can_be_turned_off_explicitly_and_none_refuses_one():
    assert BlockConfig(placement="post_ln", alpha=0.0).alpha == 0.0
    assert BlockConfig(placement="pre_ln", alpha=0.5).alpha == 0.5
    with pytest.raises(ConfigError, match="no skip connection"):
        BlockConfig(placement="none", alpha=1.0)


def test_class_and_string_presets_are_one_block():
    assert BlockConfig(placement="post_ln") == VARIANTS["skip"]
    assert BlockConfig(norm="layernorm", placement="post_ln") == VARIANTS["post_ln"]
    assert variant_name(BlockConfig(norm="layernorm", placement="post_ln")) == "post_ln"
    assert variant_name(BlockConfig(norm="layernorm", placement="post_ln", alpha=0.0)) is None


def test_one_layer_equals_the_hand_built_residual_update():
    """post_ln with norm none: X1 = X0 + A X0 W_V, A the causal softmax of
    X0 W_Q (X0 W_K)^T / sqrt(d_qk), computed here in plain float64 torch."""
    X0 = _tokens()
    d = X0.shape[-1]
    g = torch.Generator().manual_seed(3)
    Wq, Wk, Wv = (torch.randn(d, d, dtype=torch.float64, generator=g) / d ** 0.5 for _ in range(3))
    lw = LayerWeights(W_Q=Wq, W_K=Wk, W_V=Wv)
    res = simulate(X0, mask="causal", weights=[lw], d_qk=2.0, metrics=("mu",),
                   block=BlockConfig(placement="post_ln"),
                   run=RunConfig(depth=1, dtype=torch.float64, record_states=True))
    scores = (X0 @ Wq) @ (X0 @ Wk).transpose(-1, -2) / 2.0 ** 0.5
    N = X0.shape[1]
    scores = scores.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
    expected = X0 + torch.softmax(scores, dim=-1) @ X0 @ Wv
    torch.testing.assert_close(res.states[1], expected, rtol=1e-12, atol=1e-12)
    assert res.config["block"]["alpha"] == 1.0 and res.config["variant"] == "skip"


def test_post_ln_block_with_mlp_runs_the_residual_network():
    """The reported case: 4 heads, an MLP, 16 layers. Without its skip the post-LN block
    collapses to the float64 floor; the default block is the alpha=1 block exactly."""
    X0 = _tokens(B=4, N=32, d=64)
    kw = dict(mask="complete", metrics=("mu_relative",), run=RunConfig(depth=16, seed=0, dtype=torch.float64))
    default = simulate(X0, block=BlockConfig(norm="layernorm", placement="post_ln", n_heads=4, mlp=True), **kw)
    one = simulate(X0, block=BlockConfig(norm="layernorm", placement="post_ln", n_heads=4, mlp=True, alpha=1.0), **kw)
    off = simulate(X0, block=BlockConfig(norm="layernorm", placement="post_ln", n_heads=4, mlp=True, alpha=0.0), **kw)
    assert torch.equal(default.metrics["mu_relative"], one.metrics["mu_relative"])
    assert default.config["block"] == one.config["block"] and default.config["block"]["alpha"] == 1.0
    assert float(off.metrics["mu_relative"][-1].max()) < 1e-12  # no residual: collapsed to rounding
    assert float(default.metrics["mu_relative"][-1].min()) > 1e-3


def test_placement_override_moves_a_default_skip_weight_only():
    assert resolve_variant("pure", placement="pre_ln").alpha == 1.0
    assert resolve_variant("pure", placement="post_ln") == VARIANTS["skip"]
    assert resolve_variant("skip", placement="none") == VARIANTS["pure"]
    assert resolve_variant("skip", placement="pre_ln").alpha == 1.0
    assert resolve_variant("pure", placement="post_ln", alpha=0.0).alpha == 0.0
    custom = BlockConfig(placement="post_ln", alpha=0.5)
    assert resolve_variant(custom, placement="pre_ln").alpha == 0.5  # not a default: kept
    off = BlockConfig(placement="post_ln", alpha=0.0)
    assert resolve_variant(off, placement="pre_ln").alpha == 0.0


def test_cli_records_the_block_that_ran():
    p = run_cli("simulate", "--variant", "pure", "--placement", "post_ln", "--n-tokens", "6", "--depth", "2",
                "--n-samples", "1", "--d-model", "4", "--format", "json")
    assert p.returncode == 0, p.stderr
    settings = json.loads(p.stdout)["settings"]
    assert settings["block"]["placement"] == "post_ln" and settings["block"]["alpha"] == 1.0
    assert settings["variant"] == "skip" and settings["variant_option"] == "pure"


def test_variant_post_ln_is_the_post_ln_placement_with_layernorm():
    """One concept, one name (docs/cli.md, "Renamed names"): the variant ``post_ln`` runs
    exactly the block with placement ``post_ln`` and real LayerNorm, X1 = LayerNorm(X0 +
    A X0 W_V) (no affine, eps 1e-5), computed here in plain float64 torch; the record
    names both the variant and the placement ``post_ln``."""
    X0 = _tokens()
    d = X0.shape[-1]
    g = torch.Generator().manual_seed(5)
    Wq, Wk, Wv = (torch.randn(d, d, dtype=torch.float64, generator=g) / d ** 0.5 for _ in range(3))
    kw = dict(mask="causal", weights=[LayerWeights(W_Q=Wq, W_K=Wk, W_V=Wv)], d_qk=1.0, metrics=("mu",),
              run=RunConfig(depth=1, dtype=torch.float64, record_states=True))
    by_name = simulate(X0, block="post_ln", **kw)
    by_block = simulate(X0, block=BlockConfig(placement="post_ln", norm="layernorm"), **kw)
    N = X0.shape[1]
    scores = ((X0 @ Wq) @ (X0 @ Wk).transpose(-1, -2)).masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(),
                                                                    float("-inf"))
    Y = X0 + torch.softmax(scores, dim=-1) @ X0 @ Wv
    expected = (Y - Y.mean(-1, keepdim=True)) / torch.sqrt(Y.var(-1, unbiased=False, keepdim=True) + 1e-5)
    assert torch.equal(by_name.states[1], by_block.states[1])
    torch.testing.assert_close(by_name.states[1], expected, rtol=1e-12, atol=1e-12)
    assert by_name.config["variant"] == by_block.config["variant"] == "post_ln"
    assert by_name.config["block"]["placement"] == "post_ln" and by_name.config["block"]["norm"] == "layernorm"
