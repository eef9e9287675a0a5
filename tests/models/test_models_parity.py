"""Parity with transformers (models/parity.py): every family's recorded points equal its
``output_hidden_states`` entries, labelled as the probe labels them; a forward pass that
differs by more than the dtype's bound fails with one line."""

import pytest
import torch

from rankcollapse.data import Windows
from rankcollapse.errors import ModelError
from rankcollapse.models.parity import PARITY_ULPS, check_parity, parity

from family_configs import CONFIGS, build


def _windows():
    ids = torch.randint(2, 97, (3, 10), generator=torch.Generator().manual_seed(1))
    am = torch.ones_like(ids)
    am[-1, 7:] = 0  # right padding: excluded from |Δ|
    return Windows(ids, am, torch.zeros_like(ids, dtype=torch.bool))


LAST = {"bert": "layer.2.output", "roberta": "layer.2.output", "albert": "layer.2.output", "gpt2": "final_norm",
        "llama": "final_norm", "mistral": "final_norm", "qwen2": "final_norm", "gemma": "final_norm"}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_every_family_matches_output_hidden_states(kind):
    table = parity(build(kind), _windows(), batch_size=2)
    assert table["ok"].all() and (table["max_abs_diff"] == 0).all()  # the same tensors, two forward passes
    assert (table["max_abs"] > 0).all()
    assert (table["bound"] == PARITY_ULPS * torch.finfo(torch.float32).eps * table["max_abs"]).all()
    points = list(table["point"])
    if kind == "t5":  # both stacks, each ending in its final norm
        assert points == ["encoder.embeddings", "encoder.layer.0.output", "encoder.final_norm",
                          "decoder.embeddings", "decoder.layer.0.output", "decoder.final_norm"]
    elif kind in LAST:
        assert points == ["embeddings", "layer.0.output", "layer.1.output", LAST[kind]]
        assert list(table["layer"]) == [0, 1, 2, 3]
    else:  # generic: the last entry (after a final norm or not) is not compared
        assert points == ["embeddings", "layer.0.output", "layer.1.output"]
    check_parity(table)


def test_a_difference_above_the_bound_fails_naming_the_point():
    """A block that adds 1e-3 to one feature on every second call: the transformers pass
    differs from the recorded one from that block on."""
    model = build("gpt2")
    calls = []

    def nudge(module, args, output):
        calls.append(1)
        X = output[0] if isinstance(output, tuple) else output
        X = X.clone()
        X[..., 0] += 1e-3 * (len(calls) % 2 == 0)  # one feature: a constant shift would vanish in ln_f
        return (X, *output[1:]) if isinstance(output, tuple) else X

    model.h[1].register_forward_hook(nudge)
    table = parity(model, _windows(), batch_size=8)
    assert list(table["ok"]) == [True, True, False, False]
    assert table["max_abs_diff"].iloc[2] == pytest.approx(1e-3, rel=1e-3)
    # named: the point with the largest |Δ| / bound (ln_f scales the nudge up)
    with pytest.raises(ModelError, match=r"fails at final_norm \(layer 3\): max \|Δ\| .* > bound .* \(float32, "
                                         r"2 of 4 points above it\)"):
        check_parity(table)


def test_the_bound_follows_the_dtype():
    model = build("gpt2").to(torch.bfloat16)
    table = parity(model, _windows())
    assert table.attrs["dtype"] == "bfloat16" and table["ok"].all()
    assert (table["bound"] == PARITY_ULPS * 2.0**-7 * table["max_abs"]).all()
