"""One model-family registry: loading, recording and weight extraction agree."""

from types import SimpleNamespace

import pytest
import torch
from transformers import MistralConfig, MistralModel, Qwen2Config, Qwen2Model

from rankcollapse.dynamics.pretrained import extract_attention_weights, model_family
from rankcollapse.errors import ModelError
from family_configs import build
from rankcollapse.models import FAMILIES, Intervention, as_loaded, detect_family, probe
from rankcollapse.models.families import MODEL_TYPES, REGISTRY, family, family_of, native_mask, native_mask_of, point_names, stacks

TINY = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


@pytest.mark.parametrize("make", [lambda: MistralModel(MistralConfig(**TINY)),
                                  lambda: Qwen2Model(Qwen2Config(**TINY))])
def test_mistral_and_qwen2_are_llama_everywhere(make):
    torch.manual_seed(0)
    model = make().eval()
    assert detect_family(model) == model_family(model) == "llama"
    (stack,) = stacks(model, "llama")
    assert point_names(stack) == ["embeddings", "layer.0.output", "layer.1.output", "final_norm"]
    weights = extract_attention_weights(model)
    assert len(weights) == 2 and weights[0].n_heads == 4 and weights[0].n_kv_heads == 2
    qwen = model.config.model_type == "qwen2"
    assert (weights[0].b_Q is not None) == qwen  # Qwen2 has q/k/v biases, Mistral none


def test_registry_is_the_one_table():
    assert FAMILIES == (*REGISTRY, "generic")
    assert family_of("qwen2") == family_of("mistral") == "llama" and family_of("mamba") == "generic"
    assert {f.name for f in REGISTRY.values() if f.causal} == {"gpt2", "llama"}
    assert native_mask("llama", "mistral") == "causal" and native_mask("bert", "bert") == "complete"
    assert [native_mask("generic", t) for t in ("gpt_neox", "opt", "phi", "distilbert", None)] == \
        ["causal", "causal", "causal", "complete", "complete"]
    opt = SimpleNamespace(family="generic", model=SimpleNamespace(config=SimpleNamespace(model_type="opt")))
    assert native_mask_of(opt) == "causal" and native_mask_of(SimpleNamespace(**{**vars(opt), "family": "bert"})) == "complete"
    assert set(MODEL_TYPES.values()) <= set(REGISTRY)
    with pytest.raises(ModelError, match="unknown model family 'opt'"):
        family("opt")


@pytest.mark.parametrize("kind, native", [("gpt_neox", "causal"), ("opt", "causal"), ("phi", "causal"),
                                          ("distilbert", "complete")])
def test_generic_models_measure_their_own_pattern(kind, native, make_windows_tiny):
    """Without a mask, attention metrics take the model's own allowed keys: causal for the
    generic decoders (GPT-NeoX, OPT, Phi), complete for DistilBERT."""
    model = build(kind, "eager")
    torch.manual_seed(0)
    with torch.no_grad():  # weights large enough for attention rows far from uniform
        for p in model.parameters():
            p.normal_(0, 0.5)
    loaded, wins = as_loaded(model), make_windows_tiny(3, 10, pad_last=3)
    assert loaded.family == "generic"

    def entropy(mask):
        table = probe(loaded, wins, Intervention(mask=mask), metrics="attention_entropy", progress=False)
        return torch.tensor(table["mean"].to_numpy())

    own, other = entropy(None), entropy({"causal": "complete", "complete": "causal"}[native])
    torch.testing.assert_close(own, entropy(native), rtol=1e-12, atol=0)
    assert ((own - other).abs() > 1e-3).all()
