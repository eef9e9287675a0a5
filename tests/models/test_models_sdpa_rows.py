"""Attention rows of a model that keeps SDPA attention, recomputed from the queries and
keys its kernel receives, against eager attention's own ``output_attentions``."""

import pytest
import torch

from rankcollapse.models import LoadedModel, detect_family, probe
from rankcollapse.models.recorder import Recorder, sdpa_probabilities

from family_configs import build, ids

SDPA_FAMILIES = ["bert", "roberta", "albert", "gpt2", "llama", "mistral", "qwen2", "gemma"]
TOL = dict(rtol=1e-4, atol=1e-5)  # float32: SDPA and eager hidden states differ in the last bits


def _loaded(kind: str, implementation: str) -> LoadedModel:
    model = build(kind, implementation)
    return LoadedModel(model=model, tokenizer=None, family=detect_family(model), name=f"tiny-{kind}", notes=[])


def _padded() -> tuple[torch.Tensor, torch.Tensor]:
    x = ids(3, 9)
    am = torch.ones_like(x)
    am[1, 6:] = 0  # right padding
    am[2, :2] = 0  # left padding
    return x, am


@pytest.mark.parametrize("kind", SDPA_FAMILIES)
def test_sdpa_rows_equal_eager_output_attentions(kind):
    x, am = _padded()
    eager = build(kind, "eager")
    with torch.no_grad():
        want = eager(input_ids=x, attention_mask=am, output_attentions=True).attentions
    sdpa = _loaded(kind, "sdpa")
    with torch.no_grad(), Recorder(sdpa, [], attentions=True) as rec:
        sdpa.model(input_ids=x, attention_mask=am)
        assert sdpa.model.config._attn_implementation == "sdpa"  # never switched
    assert sorted(rec.attention_maps) == [f"layer.{k}.attention" for k in range(len(want))]
    for k, a in enumerate(want):
        got = rec.attention_maps[f"layer.{k}.attention"]
        assert got.shape == a.shape
        real = am.bool()[:, None, :, None]  # query rows of real tokens
        torch.testing.assert_close(got * real, a * real, **TOL)


def test_sdpa_probabilities_closed_form():
    """Two query heads share one key head (GQA); causal; scale 1: rows by hand."""
    q = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]], [[2.0, 0.0], [0.0, 0.0]]]])  # (1, 2, 2, 2)
    k = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # (1, 1, 2, 2)
    A = sdpa_probabilities(q, k, k, is_causal=True, scale=1.0, enable_gqa=True)
    e = torch.e
    want = torch.tensor([[[[1.0, 0.0], [1 / (1 + e), e / (1 + e)]], [[1.0, 0.0], [0.5, 0.5]]]])
    torch.testing.assert_close(A, want)
    keep = torch.tensor([[True, False], [True, True]])
    torch.testing.assert_close(sdpa_probabilities(q, k.expand(1, 2, 2, 2), attn_mask=keep, scale=1.0), want)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_probe_attention_metrics_sdpa_equal_eager(kind, make_windows_tiny):
    w = make_windows_tiny(n_windows=3, length=10, pad_last=3)
    metrics = ["attention_entropy", "sink_mass"]
    tables = {impl: probe(_loaded(kind, impl), w, metrics=metrics, batch_size=2) for impl in ("eager", "sdpa")}
    eager, sdpa = tables["eager"], tables["sdpa"]
    assert len(sdpa) == len(eager) > 0
    torch.testing.assert_close(torch.tensor(sdpa["mean"].to_numpy()), torch.tensor(eager["mean"].to_numpy()), **TOL)
