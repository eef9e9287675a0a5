"""``probe(points="...,module:PATH")``: any submodule's output in the same table, equal
to the stable point that taps the same tensor and to a plain forward hook."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from family_configs import build, ids

from rankcollapse.data import Windows
from rankcollapse.errors import ModelError
from rankcollapse.metrics import compute_metrics
from rankcollapse.models import probe


def _windows(x):
    return Windows(x, torch.ones_like(x), torch.zeros_like(x, dtype=torch.bool))


def _row(table, point, metric="mu"):
    return table[(table.point == point) & (table.metric == metric)].iloc[0]


def test_module_point_equals_the_stable_point_and_a_plain_hook():
    model = build("llama")
    x = ids(3, 9)
    table = probe(model, _windows(x), metrics=("mu", "stable_rank"), per_window=True,
                  points="all,module:layers.1.self_attn,module:model.layers.2.mlp")
    captured = {}

    def hook(module, args, output):
        captured["x"] = output[0]

    handle = model.layers[1].self_attn.register_forward_hook(hook)
    with torch.no_grad():
        model(input_ids=x)
    handle.remove()
    want = compute_metrics(captured["x"], ("mu",), dtype=torch.float64)["mu"].numpy()
    got = _row(table, "module:layers.1.self_attn")
    np.testing.assert_allclose(got["values"], want, rtol=1e-12)
    np.testing.assert_array_equal(got["values"], _row(table, "layer.1.attn_output")["values"])
    assert got["layer"] == 2 and _row(table, "module:model.layers.2.mlp")["layer"] == 3
    np.testing.assert_array_equal(_row(table, "module:model.layers.2.mlp", "stable_rank")["values"],
                                  _row(table, "layer.2.mlp_output", "stable_rank")["values"])
    assert "layer.0.output" in set(table.point)  # the stable points are still there


def test_module_points_beside_hidden_states_by_default_and_refusals():
    model = build("bert")
    table = probe(model, _windows(ids(2, 8)), metrics=("mu",), points="module:encoder.layer.0.attention.self.value")
    assert {"embeddings", "layer.2.output", "module:encoder.layer.0.attention.self.value"} <= set(table.point)
    with pytest.raises(ModelError, match="no module 'encoder.layer.9'"):
        probe(model, _windows(ids(2, 8)), metrics=("mu",), points="module:encoder.layer.9")
    with pytest.raises(ModelError, match="was not called"):
        probe(model, _windows(ids(2, 8)), metrics=("mu",), points="module:encoder.layer")
    with pytest.raises(ModelError, match="not tokens"):
        probe(model, _windows(ids(2, 8)), metrics=("mu",), points="module:pooler.dense")


@pytest.mark.parametrize("points, message", [
    (",", "--points ',' names no point: give hidden_states or all, plus any module:PATH items"),  # read as the default
    (" , ", "--points ' , ' names no point: give hidden_states or all, plus any module:PATH items"),
    ("hidden_states,all", "--points 'hidden_states,all': give hidden_states or all, plus any module:PATH items"),
])
def test_points_naming_no_point_are_refused(points, message):
    from rankcollapse.models.probe import check_points

    with pytest.raises(ModelError) as info:
        check_points(points)
    assert str(info.value) == message
    assert check_points("all,module:encoder") == ("all", ["module:encoder"])
