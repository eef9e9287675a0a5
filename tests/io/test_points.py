"""One naming scheme for measurement points: simulations and probes agree."""

import torch
from transformers import BertConfig, BertModel

from rankcollapse.models.families import depth_of, point_names, stacks
from rankcollapse.points import block_output, point_after


def test_point_after_counts_layers_applied():
    assert [point_after(t) for t in range(3)] == ["embeddings", "layer.0.output", "layer.1.output"]
    assert block_output(4, "encoder.") == "encoder.layer.4.output"


def test_probe_points_carry_the_same_layer_as_simulation_points():
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=3, num_attention_heads=2,
                                 intermediate_size=16)).eval()
    (stack,) = stacks(model, "bert")
    names = point_names(stack)
    assert names == [point_after(t) for t in range(4)]
    assert [depth_of(n, stack) for n in names] == [0, 1, 2, 3]
