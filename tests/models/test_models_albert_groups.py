"""ALBERT with several hidden groups: layer i runs group int(i / (L / G)), as transformers does."""

import pytest
import torch
import transformers as tf

from rankcollapse.dynamics.pretrained import extract_attention_weights
from rankcollapse.models import LoadedModel, Recorder, detect_family
from rankcollapse.models.families import albert_group


def _albert(n_layers: int, n_groups: int):
    torch.manual_seed(0)
    cfg = tf.AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=n_layers,
                          num_hidden_groups=n_groups, num_attention_heads=2, intermediate_size=32)
    return tf.AlbertModel(cfg, add_pooling_layer=False).eval()


@pytest.mark.parametrize("n_layers, n_groups, expected", [(3, 2, [0, 0, 1]), (4, 3, [0, 0, 1, 2]), (6, 3, [0, 0, 1, 1, 2, 2])])
def test_weight_extraction_follows_the_model_group_assignment(n_layers, n_groups, expected):
    assert [albert_group(i, n_layers, n_groups) for i in range(n_layers)] == expected
    model = _albert(n_layers, n_groups)
    layers = extract_attention_weights(model)
    assert [w.meta["shared_group"] for w in layers] == expected
    for w, g in zip(layers, expected):
        q = model.encoder.albert_layer_groups[g].albert_layers[0].attention.query
        assert torch.equal(w.W_Q, q.weight.T)


@pytest.mark.parametrize("n_layers, n_groups", [(3, 2), (4, 3)])
def test_recording_equals_hidden_states_with_groups(n_layers, n_groups):
    model = _albert(n_layers, n_groups)
    loaded = LoadedModel(model=model, tokenizer=None, family=detect_family(model), name="albert")
    ids = torch.randint(1, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    with Recorder(loaded) as rec, torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    hs = out.hidden_states
    assert len(hs) == n_layers + 1
    assert torch.equal(rec.outputs["embeddings"], hs[0])
    for k in range(n_layers):
        assert torch.equal(rec.outputs[f"layer.{k}.output"], hs[k + 1]), k
