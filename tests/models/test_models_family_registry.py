"""One model-family registry: loading, recording and weight extraction agree."""

import pytest
import torch
from transformers import MistralConfig, MistralModel, Qwen2Config, Qwen2Model

from rankcollapse.dynamics.pretrained import extract_attention_weights, model_family
from rankcollapse.errors import ModelError
from rankcollapse.models import FAMILIES, detect_family
from rankcollapse.models.families import MODEL_TYPES, REGISTRY, family, family_of, point_names, stacks

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
    assert family("llama").native_mask == "causal" and family("bert").native_mask == "complete"
    assert set(MODEL_TYPES.values()) <= set(REGISTRY)
    with pytest.raises(ModelError, match="unknown model family 'opt'"):
        family("opt")
