"""Per-layer mask schedules as a model intervention: block k attends through the
schedule's mask k mod period (tiny llama; real SmolLM2 marked slow)."""

import pytest
import torch

from rankcollapse.errors import ModelError
from rankcollapse.masks import parse_mask
from rankcollapse.models import intervene, model_inputs


def _attn(loaded, w, mask):
    with torch.no_grad(), intervene(loaded, attention_mask=w.attention_mask, mask=mask):
        return loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask), output_attentions=True).attentions


def test_each_block_gets_its_layer_mask(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("llama"), make_windows_tiny(pad_last=0)
    n = w.n_tokens
    atts = _attn(loaded, w, "schedule:causal_sliding_window:w=2,causal")
    assert len(atts) >= 2
    masks = [parse_mask("causal_sliding_window:w=2", n).to_dense(), parse_mask("causal", n).to_dense()]
    for k, A in enumerate(atts):  # (B, H, N, N)
        assert torch.equal(A[0, 0] > 0, masks[k % 2])
        torch.testing.assert_close(A.sum(-1), torch.ones_like(A.sum(-1)))


def test_native_causal_schedule_changes_nothing(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("llama"), make_windows_tiny(pad_last=0)
    base, sched = _attn(loaded, w, None), _attn(loaded, w, "schedule:causal*3")
    for a, b in zip(base, sched):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_shared_layers_reject_a_schedule(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("albert"), make_windows_tiny(pad_last=0)
    with pytest.raises(ModelError, match="shares its layers"):
        _attn(loaded, w, "schedule:complete,sliding_window:w=3")


def test_a_probe_parses_its_schedule_once(make_tiny, make_windows_tiny, monkeypatch):
    """Every batch and every attention map of one probe use the schedule parsed at its entry,
    and a schedule given already parsed gives the same table."""
    from rankcollapse.masks import MaskSchedule, parse_schedule
    from rankcollapse.models import Intervention, probe

    loaded, w = make_tiny("llama"), make_windows_tiny(4, 10, pad_last=0)
    spec = "schedule:causal_sliding_window:w=2,causal"
    built = []
    init = MaskSchedule.__init__
    monkeypatch.setattr(MaskSchedule, "__init__", lambda self, *a, **k: built.append(1) or init(self, *a, **k))
    metrics = ["mu", "attention_entropy"]
    table = probe(loaded, w, Intervention(mask=spec), metrics=metrics, batch_size=1, progress=False)
    assert len(built) == 1
    given = probe(loaded, w, Intervention(mask=parse_schedule(spec, w.n_tokens)), metrics=metrics, batch_size=1,
                  progress=False)
    assert len(built) == 2 and table.attrs["mask"] == spec
    assert table.equals(given)


@pytest.mark.slow
def test_smollm2_gemma3_like_schedule_vs_native_causal():
    from rankcollapse.data import make_windows, wikipedia_texts
    from rankcollapse.models import Intervention, load_model, probe

    loaded = load_model("smollm2")
    wins = make_windows(wikipedia_texts(), loaded.tokenizer, n_tokens=32, n_samples=2)
    native = probe(loaded, wins)
    sched = probe(loaded, wins, Intervention(mask="schedule:causal_sliding_window:w=4*5,causal"))
    same = probe(loaded, wins, Intervention(mask="schedule:causal*6"))
    assert list(native.columns) == list(sched.columns) and len(native) == len(sched)
    num = native.select_dtypes("number").columns
    # the native mask as a schedule reproduces the native metrics; the windowed one differs
    assert (same[num] - native[num]).abs().max().max() < 1e-3
    assert (sched[num] - native[num]).abs().max().max() > 1e-3
