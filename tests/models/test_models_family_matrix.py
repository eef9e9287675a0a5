"""Every tested family, as a plain transformers object: recording equals hidden_states,
padding on either side changes nothing, attention maps equal the model's own, and the
interventions act as their formulas say (or fail clearly where the family has no layout)."""

import pytest
import torch

from rankcollapse.errors import ModelError
from rankcollapse.models import Recorder, as_loaded, intervene, model_inputs, probe
from rankcollapse.models import detect_family, families
from rankcollapse.models.recorder import SdpaRows
from rankcollapse.data import Windows

from family_configs import CONFIGS, FULL, build, ids

KINDS = sorted(CONFIGS)
FINAL_NORM_GENERIC = {"gpt_neox", "opt", "phi"}  # hidden_states[L] is after a final norm the generic layout lacks


def _run(model, x, am, **kw):
    loaded = as_loaded(model)
    with torch.no_grad():
        return model(**model_inputs(loaded, x, am), **kw)


def _stacks(out):
    if getattr(out, "encoder_hidden_states", None) is not None:
        return {"encoder.": out.encoder_hidden_states, "decoder.": out.decoder_hidden_states}
    return {"": out.hidden_states}


@pytest.mark.parametrize("kind", KINDS)
def test_recording_equals_hidden_states(kind):
    model = build(kind)
    x = ids()
    am = torch.ones_like(x)
    with Recorder(model) as rec:
        out = _run(model, x, am, output_hidden_states=True)
    for prefix, hs in _stacks(out).items():
        n = len(hs) - 1
        assert torch.equal(rec.outputs[f"{prefix}embeddings"], hs[0])
        for k in range(n - 1):
            assert torch.equal(rec.outputs[f"{prefix}layer.{k}.output"], hs[k + 1]), (prefix, k)
        last = f"{prefix}final_norm" if f"{prefix}final_norm" in rec.outputs else f"{prefix}layer.{n - 1}.output"
        if kind not in FINAL_NORM_GENERIC:
            assert torch.equal(rec.outputs[last], hs[n]), last


def _padded(x, pads: int, side: str, pad_id: int = 1):
    B, N = x.shape
    fill = torch.full((B, pads), pad_id, dtype=x.dtype)
    xp = torch.cat([fill, x], 1) if side == "left" else torch.cat([x, fill], 1)
    am = torch.zeros(B, N + pads, dtype=torch.long)
    real = slice(pads, None) if side == "left" else slice(0, N)
    am[:, real] = 1
    return xp, am, real


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", KINDS)
def test_padding_on_either_side_gives_the_unpadded_values(kind, side):
    model = build(kind)
    x = ids()
    with Recorder(model) as rec:
        _run(model, x, torch.ones_like(x))
    plain = dict(rec.outputs)
    xp, am, real = _padded(x, 4, side)
    with Recorder(model) as rec:
        _run(model, xp, am)
    for name, X in plain.items():
        if name.startswith("decoder."):
            continue  # the decoder input is the shifted window: its padding moves with it
        assert torch.allclose(rec.outputs[name][:, real], X, atol=2e-5, rtol=1e-4), name


def test_left_padding_position_ids_follow_the_mask():
    from rankcollapse.models import position_ids

    am = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert position_ids(am).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0]]
    assert position_ids(am, "padding_idx", 1).tolist() == [[1, 1, 2, 3, 4], [2, 3, 4, 1, 1]]


@pytest.mark.parametrize("kind", KINDS)
def test_attention_maps_equal_the_eager_model_output(kind):
    """Exactly the eager output where the recorder switches to eager; SDPA rows (recomputed
    from the kernel's queries and keys) within float32 round-off of it."""
    model = build(kind)  # the default implementation (SDPA where available)
    before = model.config._attn_implementation
    recomputed = SdpaRows.applies(model, families.stacks(model, detect_family(model)))
    eager = build(kind, "eager")
    x = ids()
    am = torch.ones_like(x)
    with Recorder(model, attentions=True) as rec:
        _run(model, x, am)
    assert model.config._attn_implementation == before
    ref = _run(eager, x, am, output_attentions=True)
    maps = {"": getattr(ref, "attentions", None)}
    if getattr(ref, "encoder_attentions", None) is not None:
        maps = {"encoder.": ref.encoder_attentions, "decoder.": ref.decoder_attentions}
    for prefix, tup in maps.items():
        for k, a in enumerate(tup):
            got = rec.attention_maps[f"{prefix}layer.{k}.attention"]
            assert got.shape == a.shape == (2, 4, 8, 8)
            if recomputed:
                torch.testing.assert_close(got, a, rtol=1e-4, atol=1e-5)
            else:
                assert torch.equal(got, a), (prefix, k)
            assert torch.allclose(got.sum(-1), torch.ones(()), atol=1e-5)


def _layer0(model, x, **intervention):
    loaded = as_loaded(model)
    am = torch.ones_like(x)
    with intervene(loaded, attention_mask=am, **intervention), Recorder(model, attentions=True) as rec:
        _run(model, x, am)
    prefix = "encoder." if any(k.startswith("encoder.") for k in rec.attention_maps) else ""
    return rec.attention_maps[f"{prefix}layer.0.attention"].double(), rec


@pytest.mark.parametrize("kind", KINDS)
def test_mask_and_temperature_act_on_the_attention_probabilities(kind):
    model = build(kind)
    x = ids()
    base, _ = _layer0(model, x)
    n = x.shape[1]
    # mask: rows renormalised over the allowed keys (layer 0's input is unchanged)
    M = torch.ones(n, n, dtype=torch.bool).tril() & ~torch.ones(n, n, dtype=torch.bool).tril(-3)  # window of 3
    masked, _ = _layer0(model, x, mask=M)
    expected = base * M / (base * M).sum(-1, keepdim=True)
    assert torch.allclose(masked, expected, atol=1e-5)
    if kind == "t5":
        return  # T5's relative position bias is not scaled by d_qk
    # temperature s: softmax(logits / sqrt(s)), i.e. p^(1/sqrt(s)) renormalised
    s = 4.0
    hot, _ = _layer0(model, x, d_qk_scale=s)
    powered = base ** (1 / s**0.5)
    assert torch.allclose(hot, powered / powered.sum(-1, keepdim=True), atol=1e-5)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_dropping_the_mlp_zeroes_its_branch(kind):
    model = build(kind)
    loaded = as_loaded(model)
    x = ids()
    am = torch.ones_like(x)
    prefix = "encoder." if kind == "t5" else ""
    names = [f"{prefix}layer.0.mlp_output", f"{prefix}layer.0.output"]
    with Recorder(model, names) as rec:
        _run(model, x, am)
    kept = dict(rec.outputs)
    with intervene(loaded, drop="mlp"), Recorder(model, names) as rec:
        _run(model, x, am)
    assert kept[names[0]].abs().max() > 0
    assert torch.equal(rec.outputs[names[0]], torch.zeros_like(kept[names[0]]))
    assert not torch.allclose(rec.outputs[names[1]], kept[names[1]])


@pytest.mark.parametrize("kind", sorted(set(CONFIGS) - FULL))
def test_generic_layouts_take_the_own_mask(kind):
    # the generic layout knows these families' attention modules: their own pattern as a
    # replacement mask reproduces the model
    model = build(kind)
    loaded = as_loaded(model)
    x = ids()
    am = torch.ones_like(x)
    own = "causal" if kind in ("gpt_neox", "opt", "phi") else "complete"
    with intervene(loaded, mask=own, attention_mask=am), Recorder(model) as rec:
        _run(model, x, am)
    with Recorder(model) as ref:
        _run(model, x, am)
    for p, X in ref.outputs.items():
        torch.testing.assert_close(rec.outputs[p], X, atol=1e-5, rtol=1e-5)


def test_probe_accepts_a_plain_model_with_a_head():
    import transformers as tf

    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(CONFIGS["gpt2"]()).eval()
    x = ids()
    w = Windows(x, torch.ones_like(x), torch.zeros_like(x, dtype=torch.bool))
    df = probe(model, w, metrics=("mu",))
    with Recorder(model) as rec, torch.no_grad():
        out = model(input_ids=x, output_hidden_states=True)
    from rankcollapse.metrics import mu

    got = df[(df.point == "layer.1.output")]["mean"].iloc[0]
    assert got == pytest.approx(float(mu(out.hidden_states[2].double()).mean()), rel=1e-6)
    assert torch.equal(rec.outputs["layer.1.output"], out.hidden_states[2])


def test_anything_else_is_a_clear_error():
    with pytest.raises(ModelError, match="PreTrainedModel, got Linear"):
        Recorder(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("kind", ["roberta", "gemma", "mistral", "qwen2"])
def test_weight_extraction_reproduces_the_first_attention_layer(kind):
    from rankcollapse.dynamics import RunConfig, simulate
    from rankcollapse.dynamics.pretrained import extract_attention_weights

    model = build(kind, "eager")
    x = ids(1, 8)
    causal = kind != "roberta"
    M = torch.ones(8, 8, dtype=torch.bool)
    M = M.tril() if causal else M
    with Recorder(model, ["embeddings", "layer.0.attn_output", "layer.0.norm_1"]) as rec:
        _run(model, x, torch.ones_like(x))
    X = rec.outputs["embeddings"] if kind == "roberta" else rec.outputs["layer.0.norm_1"]
    weights = extract_attention_weights(model)
    res = simulate(X.double(), mask=M, weights=[weights[0]], metrics={"n": lambda Z: Z.norm()},
                   run=RunConfig(depth=1, record_states=True, dtype=torch.float64))
    torch.testing.assert_close(res.states[1].float(), rec.outputs["layer.0.attn_output"], rtol=1e-4, atol=1e-5)


def test_left_padded_gpt2_probe_gives_the_unpadded_metrics():
    model = build("gpt2")
    x = ids(1, 8)
    plain = probe(model, Windows(x, torch.ones_like(x), torch.zeros_like(x, dtype=torch.bool)), metrics=("mu",))
    xp, am, _ = _padded(x, 4, "left")
    padded = probe(model, Windows(xp, am, torch.zeros_like(xp, dtype=torch.bool)), metrics=("mu",))
    assert padded["mean"].to_numpy() == pytest.approx(plain["mean"].to_numpy(), rel=1e-5)
