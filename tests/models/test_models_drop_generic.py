"""``drop`` on the generic layouts (GPT-NeoX, OPT, Phi, DistilBERT) against forward
passes edited by hooks written here, on tiny models built from configs."""

import dataclasses

import pytest
import torch
import transformers as tf

from family_configs import CONFIGS, ids
from rankcollapse.errors import ModelError
from rankcollapse.models import as_loaded, intervene
from rankcollapse.models.probe import model_inputs

# kind -> (blocks, attention module, MLP output module, block norms): module names read
# off each family's transformers code, independently of rankcollapse.models.families
LAYOUTS = {
    "gpt_neox": (lambda m: m.layers, "attention", "mlp", ("input_layernorm", "post_attention_layernorm")),
    "opt": (lambda m: m.decoder.layers, "self_attn", "fc2", ("self_attn_layer_norm", "final_layer_norm")),
    "phi": (lambda m: m.layers, "self_attn", "mlp", ("input_layernorm",)),
    "distilbert": (lambda m: m.transformer.layer, "attention", "ffn", ("sa_layer_norm", "output_layer_norm")),
}
# the block variants: GPT-NeoX parallel (default) or sequential, OPT pre-LN (default) or post-LN (OPT-350m)
KINDS = ("gpt_neox", "gpt_neox:sequential", "opt", "opt:post_ln", "phi", "distilbert")


def _build(kind: str):
    base, _, variant = kind.partition(":")
    config = CONFIGS[base]()
    if variant == "sequential":
        config.use_parallel_residual = False
    if variant == "post_ln":
        config.do_layer_norm_before = False
    torch.manual_seed(0)
    return tf.AutoModel.from_config(config).eval()


def _hidden_states(model, hooks=()) -> tuple[torch.Tensor, ...]:
    """Every ``hidden_states`` entry of one forward pass, with ``(module, hook)`` forward hooks."""
    x = ids()
    handles = [m.register_forward_hook(h) for m, h in hooks]
    try:
        with torch.no_grad():
            return model(**model_inputs(as_loaded(model), x, torch.ones_like(x)), output_hidden_states=True).hidden_states
    finally:
        for h in handles:
            h.remove()


def _parts(model, kind: str, k: int = 0):
    blocks, attn, mlp, norms = LAYOUTS[kind.partition(":")[0]]
    block = blocks(model)[k]
    return block, getattr(block, attn), getattr(block, mlp), [getattr(block, n) for n in norms]


@pytest.mark.parametrize("kind", KINDS)
def test_drop_mlp_equals_zeroing_the_mlp_output_by_hand(kind):
    model = _build(kind)
    mlps = [_parts(model, kind, k)[2] for k in range(model.config.num_hidden_layers)]
    by_hand = _hidden_states(model, [(m, lambda mod, a, out: torch.zeros_like(out)) for m in mlps])
    with intervene(as_loaded(model), drop="mlp"):
        dropped = _hidden_states(model)
    assert not torch.equal(by_hand[1], _hidden_states(model)[1])  # the MLP mattered
    for got, want in zip(dropped, by_hand):
        assert torch.equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_drop_norm_equals_identity_norms_by_hand(kind):
    model = _build(kind)
    norms = [n for k in range(model.config.num_hidden_layers) for n in _parts(model, kind, k)[3]]
    by_hand = _hidden_states(model, [(n, lambda mod, a, out: a[0]) for n in norms])
    with intervene(as_loaded(model), drop="norm"):
        dropped = _hidden_states(model)
    assert not torch.equal(by_hand[1], _hidden_states(model)[1])
    for got, want in zip(dropped, by_hand):
        assert torch.equal(got, want)


def _skip_by_hand(model, kind: str, with_mlp: bool) -> torch.Tensor:
    """Block 0's output with its residual removed (and its MLP, with ``with_mlp=False``),
    computed from the attention output A and the MLP of a clean forward pass."""
    block, attn, mlp, norms = _parts(model, kind)
    seen = {}
    _hidden_states(model, [(attn, lambda mod, a, out: seen.setdefault("A", out[0])),
                           (mlp, lambda mod, a, out: seen.setdefault("M", out))])
    A = seen["A"]  # SA(LN X) (pre-LN, parallel) or SA(X) (post-LN): the input X of block 0 is unchanged
    with torch.no_grad():
        if kind in ("gpt_neox", "phi"):  # parallel: X + SA(LN X) + MLP(LN' X) -> SA(LN X) + MLP(LN' X)
            return A + seen["M"] if with_mlp else A
        if kind == "gpt_neox:sequential":  # h = SA(LN X); h + MLP(LN' h) -> MLP(LN' h)
            return mlp(norms[1](A)) if with_mlp else A
        if kind == "opt":
            return mlp(block.activation_fn(block.fc1(norms[1](A)))) if with_mlp else A
        h = norms[0](A)  # post-LN: LN(X + SA(X)) -> LN(SA(X)); LN'(h + MLP(h)) -> LN'(MLP(h))
        if kind == "opt:post_ln":
            return norms[1](mlp(block.activation_fn(block.fc1(h))) if with_mlp else h)
        return norms[1](mlp(h) if with_mlp else h)  # distilbert


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_mlp", [True, False], ids=["skip", "skip+mlp"])
def test_drop_skip_equals_the_block_computed_by_hand(kind, with_mlp):
    # float64: skip is branch - residual added to the residual, exact up to the rounding
    # of that sum (ulps of the residual, amplified by a following LayerNorm's 1/std);
    # 1e6 ulps stays far below the O(1e-2) effect of any other semantics
    model = _build(kind).double()
    want = _skip_by_hand(model, kind, with_mlp)
    with intervene(as_loaded(model), drop="skip:0" if with_mlp else "skip:0,mlp:0"):
        got = _hidden_states(model)[1]
    torch.testing.assert_close(got, want, atol=1e6 * torch.finfo(torch.float64).eps, rtol=0)
    assert not torch.allclose(got, _hidden_states(model)[1])


def test_drop_on_an_unknown_generic_layout_is_refused():
    generic = dataclasses.replace(as_loaded(tf.BertModel(CONFIGS["bert"]()).eval()), family="generic")
    with pytest.raises(ModelError, match="drop is not supported for the generic family"):
        with intervene(generic, drop="mlp"):
            pass


@pytest.mark.parametrize("kind", ["gpt_neox", "distilbert"])
def test_final_norm_is_refused_where_the_layout_records_none(kind):
    with pytest.raises(ModelError, match="no final norm to drop"):
        with intervene(as_loaded(_build(kind)), drop="final_norm"):
            pass
