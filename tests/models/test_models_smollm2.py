"""Real SmolLM2-135M (Q4_1 weights dequantised): recorder vs hidden_states including the
final-norm entry, and the causal-sliding-window and temperature interventions."""

import pytest
import torch

from rankcollapse.data import make_windows, wikipedia_texts
from rankcollapse.models import Recorder, intervene, load_model, model_inputs, probe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol():
    loaded = load_model("smollm2")
    wins = make_windows(wikipedia_texts(), loaded.tokenizer, n_tokens=24, n_samples=2)
    inputs = model_inputs(loaded, wins.input_ids, wins.attention_mask)
    with torch.no_grad():
        hs = loaded.model(**inputs, output_hidden_states=True).hidden_states
    return loaded, wins, inputs, hs


def _last(loaded, wins, inputs, **kw):
    with torch.no_grad(), intervene(loaded, attention_mask=wins.attention_mask, **kw):
        return loaded.model(**inputs).last_hidden_state


def test_family_and_quantisation_note(smol):
    loaded = smol[0]
    assert loaded.family == "llama" and any("quantised" in n for n in loaded.notes)


def test_recorder_equals_hidden_states_with_final_norm_label(smol):
    loaded, wins, inputs, hs = smol
    with Recorder(loaded) as rec, torch.no_grad():
        loaded.model(**inputs)
    L = len(hs) - 1
    assert L == 30
    for i, h in enumerate(hs):
        name = "embeddings" if i == 0 else ("final_norm" if i == L else f"layer.{i - 1}.output")
        torch.testing.assert_close(rec.outputs[name], h, atol=1e-6, rtol=0)


def test_causal_sliding_window_covering_sequence_changes_nothing(smol):
    loaded, wins, inputs, hs = smol
    n = wins.n_tokens
    full = _last(loaded, wins, inputs, mask=f"causal_sliding_window:w={n}")
    torch.testing.assert_close(full, hs[-1], atol=1e-5, rtol=1e-5)
    narrow = _last(loaded, wins, inputs, mask="causal_sliding_window:w=4")
    assert (narrow - hs[-1]).abs().max() > 1e-2


def test_temperature_one_is_exact_and_other_scales_differ(smol):
    loaded, wins, inputs, hs = smol
    assert torch.equal(_last(loaded, wins, inputs, d_qk_scale=1.0), hs[-1])
    assert (_last(loaded, wins, inputs, d_qk_scale=4.0) - hs[-1]).abs().max() > 1e-2


def test_probe_table_notes_and_final_norm_layer(smol):
    loaded, wins = smol[0], smol[1]
    df = probe(loaded, wins, metrics=["mu_relative"])
    assert any("quantised" in n for n in df.attrs["notes"])
    assert int(df[df.point == "final_norm"].layer.iloc[0]) == 30
    assert int(df[df.point == "layer.29.output"].layer.iloc[0]) == 30
