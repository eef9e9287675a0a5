"""Edits, head ablation and activation patching against hooks written by hand in the
test: each edited probe equals the plain probe of the model under the hand-made hook."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from family_configs import build

from rankcollapse.data import Windows
from rankcollapse.errors import ConfigError, ModelError
from rankcollapse.models import Intervention, Recorder, as_loaded, probe
from rankcollapse.models.edits import HeadAblation, parse_heads
from rankcollapse.models.patching import patch

METRICS = ["mu", "rank_fraction", "avg_abs_cos", "max_norm_ratio"]
D_HEAD = 8  # tiny configs: width 32, 4 heads


def _probe(loaded, w, **kw):
    return probe(loaded, w, Intervention(**kw), metrics=METRICS, batch_size=2, progress=False, per_window=True)


def _same(got, want):
    assert list(got["point"]) == list(want["point"])
    for a, b, p in zip(got["values"], want["values"], got["point"]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9, err_msg=p)


def _by_hand(loaded, w, module, hook, pre=False, **kw):
    """The probe of the model with ``hook`` registered on ``module`` by the test."""
    handle = module.register_forward_pre_hook(hook) if pre else module.register_forward_hook(hook)
    try:
        return _probe(loaded, w, **kw)
    finally:
        handle.remove()


def _out_proj(loaded, layer):
    m = loaded.model
    return {"gpt2": lambda: m.h[layer].attn.c_proj, "llama": lambda: m.layers[layer].self_attn.o_proj,
            "bert": lambda: m.encoder.layer[layer].attention.output.dense,
            "t5": lambda: m.encoder.block[layer].layer[0].SelfAttention.o}[loaded.family]()


def _blocks(loaded):
    return {"gpt2": loaded.model.h, "llama": loaded.model.layers}.get(loaded.family)


def test_edit_at_a_point_and_a_module_path_equals_a_hand_hook(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("llama"), make_windows_tiny()
    seen = {}

    def double(X, ctx):
        seen[ctx.point] = (tuple(X.shape), ctx.windows)
        return 2 * X

    got = _probe(loaded, w, edits={"layer.1.output": double})
    want = _by_hand(loaded, w, loaded.model.layers[1], lambda m, a, out: (2 * out[0],) + out[1:]
                    if isinstance(out, tuple) else 2 * out)
    _same(got, want)
    assert seen["layer.1.output"] == ((1, 10, 32), range(2, 3))  # the last batch: window 2
    plain = _probe(loaded, w)
    assert np.array_equal(got["values"][0], plain["values"][0])  # embeddings: before the edit
    assert not np.allclose(got["values"].iloc[-1], plain["values"].iloc[-1])  # downstream re-measured
    assert got.attrs["edits"] == ["layer.1.output"]

    zero = _probe(loaded, w, edits={"module:layers.0.mlp": lambda X, ctx: torch.zeros_like(X)})
    _same(zero, _by_hand(loaded, w, loaded.model.layers[0].mlp, lambda m, a, out: torch.zeros_like(out)))


def test_edit_at_an_input_point_equals_a_hand_pre_hook(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("bert"), make_windows_tiny()
    got = _probe(loaded, w, edits={"layer.1.input": lambda X, ctx: X.flip(1)})
    want = _by_hand(loaded, w, loaded.model.encoder.layer[1], lambda m, a: (a[0].flip(1),) + a[1:], pre=True)
    _same(got, want)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert", "t5"])
def test_zero_ablation_equals_zeroed_columns_of_the_output_projection_input(kind, make_tiny, make_windows_tiny):
    loaded, w = make_tiny(kind), make_windows_tiny()

    def hook(module, args):
        Z = args[0].clone()
        Z[..., 2 * D_HEAD: 3 * D_HEAD] = 0  # head 2
        Z[..., 0: D_HEAD] = 0  # head 0
        return (Z,)

    got = _probe(loaded, w, ablate_heads=HeadAblation(((1, 2), (1, 0))))
    _same(got, _by_hand(loaded, w, _out_proj(loaded, 1), hook, pre=True))
    assert got.attrs["ablate_heads"] == {"heads": [[1, 2], [1, 0]], "mode": "zero"}


def test_ablation_in_a_shared_layer_acts_at_its_depth_only(make_tiny, make_windows_tiny):
    # ALBERT runs one layer at every depth: the hand hook counts the calls of the
    # shared projection in each forward pass and zeroes head 1 at the second call only
    loaded, w = make_tiny("albert"), make_windows_tiny()
    dense = loaded.model.encoder.albert_layer_groups[0].albert_layers[0].attention.dense
    calls = {"n": 0}

    def reset(module, args, kwargs):
        calls["n"] = 0

    def hook(module, args):
        calls["n"] += 1
        if calls["n"] != 2:
            return None
        Z = args[0].clone()
        Z[..., D_HEAD: 2 * D_HEAD] = 0
        return (Z,)

    handle = loaded.model.register_forward_pre_hook(reset, with_kwargs=True)
    try:
        want = _by_hand(loaded, w, dense, hook, pre=True)
    finally:
        handle.remove()
    got = _probe(loaded, w, ablate_heads=HeadAblation(((1, 1),)))
    _same(got, want)
    plain = _probe(loaded, w)
    for point, same in (("layer.0.output", True), ("layer.1.output", False)):  # before and at the ablated depth
        rows = got["point"] == point
        assert np.array_equal(np.stack(got["values"][rows]), np.stack(plain["values"][rows])) == same, point


def test_mean_ablation_uses_the_mean_over_windows_of_real_tokens(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("llama"), make_windows_tiny(n_windows=4, pad_last=3)
    o_proj = _out_proj(loaded, 2)
    rows = []
    handle = o_proj.register_forward_pre_hook(lambda m, a: rows.append(a[0].detach().double()))
    try:
        _probe(loaded, w)
    finally:
        handle.remove()
    Z = torch.cat(rows)  # (B, N, H·d_head), every window
    real = w.attention_mask.double()[:, :, None]
    mean = (Z * real).sum(0) / real.sum(0)  # (N, H·d_head): positions 7-9 have 3 real windows
    cols = slice(3 * D_HEAD, 4 * D_HEAD)

    def hook(module, args):
        X = args[0].clone()
        X[..., cols] = mean[None, :, cols].to(X)
        return (X,)

    got = _probe(loaded, w, ablate_heads=HeadAblation(((2, 3),), mode="mean"))
    _same(got, _by_hand(loaded, w, o_proj, hook, pre=True))


def test_recorded_heads_point_is_the_output_projection_input(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("gpt2"), make_windows_tiny()
    seen = []
    handle = loaded.model.h[0].attn.c_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    try:
        with torch.no_grad(), Recorder(loaded, ["layer.0.heads"]) as rec:
            loaded.model(input_ids=w.input_ids, attention_mask=w.attention_mask)
    finally:
        handle.remove()
    assert torch.equal(rec.outputs["layer.0.heads"], seen[0])
    shapes = []
    _probe(loaded, w, edits={"layer.0.heads": lambda Z, ctx: shapes.append(tuple(Z.shape)) or Z})
    assert shapes[0] == (2, 10, 4, D_HEAD)  # (B, N, H, d_head)


def _pair(kind_windows):
    clean = kind_windows(n_windows=3, pad_last=2)
    g = torch.Generator().manual_seed(7)
    corrupted_ids = torch.randint(1, 97, clean.input_ids.shape, generator=g)
    return clean, Windows(corrupted_ids, clean.attention_mask, clean.special_tokens_mask)


def test_patching_a_block_output_gives_the_clean_run_downstream(make_tiny, make_windows_tiny):
    loaded = make_tiny("llama")
    clean, corrupted = _pair(make_windows_tiny)
    delta = patch(loaded, clean, corrupted, point="layer.1.output", metrics=METRICS, batch_size=2)
    a, b = _probe(loaded, clean), _probe(loaded, corrupted)
    for i, point in enumerate(delta["point"]):
        if point in ("embeddings", "layer.0.output"):  # before the patch: nothing changes
            assert np.all(delta["values"][i] == 0), point
        else:  # the rest of the model sees the clean residual stream
            np.testing.assert_allclose(delta["values"][i], a["values"][i] - b["values"][i], rtol=1e-5, atol=1e-6,
                                       err_msg=point)
    assert delta.attrs["patch_point"] == "layer.1.output"


def test_patching_one_head_equals_a_hand_hook(make_tiny, make_windows_tiny):
    loaded = make_tiny("gpt2")
    clean, corrupted = _pair(make_windows_tiny)
    c_proj = loaded.model.h[1].attn.c_proj
    rows = []
    handle = c_proj.register_forward_pre_hook(lambda m, a: rows.append(a[0].detach()))
    try:
        _probe(loaded, clean)
    finally:
        handle.remove()
    source = torch.cat(rows)
    at = {"start": 0}
    cols = slice(1 * D_HEAD, 2 * D_HEAD)

    def hook(module, args):
        X = args[0].clone()
        B = X.shape[0]
        X[..., cols] = source[at["start"]: at["start"] + B, :, cols]
        at["start"] += B
        return (X,)

    patched = _by_hand(loaded, corrupted, c_proj, hook, pre=True)
    base = _probe(loaded, corrupted)
    delta = patch(loaded, clean, corrupted, point="layer.1.heads", head=1, metrics=METRICS, batch_size=2)
    for i, point in enumerate(delta["point"]):
        np.testing.assert_allclose(delta["values"][i], patched["values"][i] - base["values"][i], rtol=1e-6,
                                   atol=1e-9, err_msg=point)
    assert np.abs(delta.loc[delta["point"] == "layer.2.output", "mean"]).max() > 0


def test_refusals(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("llama"), make_windows_tiny()
    with pytest.raises(ModelError, match="no point 'layer.9.output'"):
        _probe(loaded, w, edits={"layer.9.output": lambda X, ctx: X})
    with pytest.raises(ConfigError, match="returned"):
        _probe(loaded, w, edits={"layer.0.output": lambda X, ctx: X[:, :1]})
    with pytest.raises(ConfigError, match="heads 0..3"):
        _probe(loaded, w, ablate_heads=HeadAblation(((0, 4),)))
    with pytest.raises(ConfigError, match="unknown ablation"):
        HeadAblation(((0, 1),), mode="resample")
    for heads in ((3, 1), ((3, 1.5),), ((3,),)):  # not nested, a float head, not a pair
        with pytest.raises(ConfigError, match="pairs of integers"):
            HeadAblation(heads)
    with pytest.raises(ConfigError, match=r"a \(layer, head\) is given twice"):  # --ablate-heads 0.0,0.0
        HeadAblation(parse_heads("0.0,0.0"))
    with pytest.raises(ConfigError, match="LAYER.HEAD"):
        parse_heads("3,1")
    assert parse_heads("3.1, 0.2") == ((3, 1), (0, 2))
    clean, corrupted = _pair(make_windows_tiny)
    with pytest.raises(ConfigError, match="layer.k.heads"):
        patch(loaded, clean, corrupted, point="layer.0.output", head=1)
    short = Windows(corrupted.input_ids[:, :5], corrupted.attention_mask[:, :5], corrupted.special_tokens_mask[:, :5])
    with pytest.raises(ConfigError, match="differ in shape"):
        patch(loaded, clean, short, point="layer.0.output")


@pytest.mark.parametrize("kind, out_proj", [("gpt_neox", "attention.dense"), ("opt", "self_attn.out_proj"),
                                            ("phi", "self_attn.dense"), ("distilbert", "attention.out_lin")])
def test_generic_layouts_take_edits_and_head_ablation(kind, out_proj, make_windows_tiny):
    loaded, w = as_loaded(build(kind)), make_windows_tiny()
    assert loaded.family == "generic"
    blocks = next(m for m in loaded.model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == 3)
    got = _probe(loaded, w, edits={"layer.1.output": lambda X, ctx: X.flip(1)})
    want = _by_hand(loaded, w, blocks[1], lambda m, a, out: (out[0].flip(1),) + tuple(out[1:])
                    if isinstance(out, tuple) else out.flip(1))
    _same(got, want)

    def hook(module, args):
        Z = args[0].clone()
        Z[..., 2 * D_HEAD: 3 * D_HEAD] = 0
        return (Z,) + args[1:]

    got = _probe(loaded, w, ablate_heads=HeadAblation(((1, 2),)))
    _same(got, _by_hand(loaded, w, blocks[1].get_submodule(out_proj), hook, pre=True))
    plain = _probe(loaded, w)
    assert not all(np.allclose(a, b, rtol=1e-4) for a, b in zip(got["values"], plain["values"]))


def _gpt2_windows(make_tiny, make_windows_tiny):
    return make_tiny("gpt2"), make_windows_tiny()


def _zero_head_2(module, args):
    Z = args[0].clone()
    Z[..., 2 * D_HEAD: 3 * D_HEAD] = 0  # head 2
    return (Z,) + args[1:]


def test_captured_states_under_ablation_equal_a_hand_hook(make_tiny, make_windows_tiny):
    from rankcollapse.models.states import capture_states

    loaded, w = _gpt2_windows(make_tiny, make_windows_tiny)
    got = capture_states(loaded, w, Intervention(ablate_heads=HeadAblation(((1, 2),))), batch_size=2, attentions=True)
    handle = _out_proj(loaded, 1).register_forward_pre_hook(_zero_head_2)
    try:
        want = capture_states(loaded, w, batch_size=2, attentions=True)
    finally:
        handle.remove()
    plain = capture_states(loaded, w, batch_size=2)
    assert got.points == want.points == ("embeddings", "layer.0.output", "layer.1.output", "layer.2.output", "final_norm")
    assert torch.equal(got.hidden_states, want.hidden_states)
    assert torch.equal(got.attentions, want.attentions)
    assert torch.equal(got.hidden_states[:, :2], plain.hidden_states[:, :2])  # before the ablated block
    assert not torch.allclose(got.hidden_states[:, 2], plain.hidden_states[:, 2])
    assert got.settings["ablate_heads"] == {"heads": [[1, 2]], "mode": "zero"}


def test_captured_states_under_a_mean_ablation_give_the_probe_table(make_tiny, make_windows_tiny):
    from rankcollapse.models.states import capture_states, states_table

    loaded, w = make_tiny("llama"), make_windows_tiny(n_windows=4, pad_last=3)
    ablation = HeadAblation(((1, 3), (0, 1)), mode="mean")
    states = capture_states(loaded, w, Intervention(ablate_heads=ablation), batch_size=2)
    table = states_table(states, metrics=METRICS, per_window=True)
    _same(table, _probe(loaded, w, ablate_heads=ablation))
    assert table.attrs["ablate_heads"] == {"heads": [[1, 3], [0, 1]], "mode": "mean"}


def test_attention_maps_under_ablation_and_edits_equal_a_hand_hook(make_tiny, make_windows_tiny):
    from rankcollapse.models import attention_maps

    loaded, w = _gpt2_windows(make_tiny, make_windows_tiny)
    got = attention_maps(loaded, w, Intervention(ablate_heads=HeadAblation(((0, 2),))), batch_size=2)
    plain = attention_maps(loaded, w, batch_size=2)
    handle = _out_proj(loaded, 0).register_forward_pre_hook(_zero_head_2)
    try:
        want = attention_maps(loaded, w, batch_size=2)
    finally:
        handle.remove()
    assert list(got) == ["layer.0.attention", "layer.1.attention", "layer.2.attention"]
    for name in got:
        assert torch.equal(got[name], want[name]), name
    assert torch.equal(got["layer.0.attention"], plain["layer.0.attention"])  # the ablation acts after block 0's maps
    assert not torch.allclose(got["layer.1.attention"], plain["layer.1.attention"])
    flipped = attention_maps(loaded, w, Intervention(edits={"layer.0.output": lambda X, ctx: X.flip(1)}), batch_size=2)
    handle = loaded.model.h[0].register_forward_hook(lambda m, a, out: (out[0].flip(1),) + tuple(out[1:])
                                                     if isinstance(out, tuple) else out.flip(1))
    try:
        want = attention_maps(loaded, w, batch_size=2)
    finally:
        handle.remove()
    assert torch.equal(flipped["layer.1.attention"], want["layer.1.attention"])


@pytest.mark.parametrize("attention, module", [
    ("self", lambda m: m.encoder.block[1].layer[0].SelfAttention.o),
    ("decoder", lambda m: m.decoder.block[1].layer[0].SelfAttention.o),
    ("cross", lambda m: m.decoder.block[1].layer[1].EncDecAttention.o),
])
def test_t5_ablation_of_encoder_decoder_and_cross_heads_equals_a_hand_hook(attention, module, make_tiny,
                                                                          make_windows_tiny):
    from rankcollapse.models.states import capture_states

    loaded, w = make_tiny("t5"), make_windows_tiny()
    got = capture_states(loaded, w, Intervention(ablate_heads=HeadAblation(((1, 2),), attention=attention)), batch_size=2)
    handle = module(loaded.model).register_forward_pre_hook(_zero_head_2)
    try:
        want = capture_states(loaded, w, batch_size=2)
    finally:
        handle.remove()
    plain = capture_states(loaded, w, batch_size=2)
    assert torch.equal(got.hidden_states, want.hidden_states)
    changed = {p for i, p in enumerate(got.points) if not torch.equal(got.hidden_states[:, i], plain.hidden_states[:, i])}
    decoder_from_1 = {"decoder.layer.1.output", "decoder.final_norm"}
    if attention == "self":  # the encoder from block 1 on, and the whole decoder, which reads its output
        assert changed == {"encoder.layer.1.output", "encoder.final_norm", "decoder.layer.0.output"} | decoder_from_1
    else:
        assert changed == decoder_from_1
    assert got.settings["ablate_heads"] == {"heads": [[1, 2]], "mode": "zero",
                                            **({} if attention == "self" else {"attention": attention})}


def test_decoder_and_cross_ablations_need_a_decoder(make_tiny, make_windows_tiny):
    from rankcollapse.models.edits import check_ablation

    assert check_ablation(make_tiny("t5"), HeadAblation(((1, 2),), attention="cross")) == "decoder."
    assert check_ablation(make_tiny("t5"), HeadAblation(((1, 2),))) == "encoder."
    with pytest.raises(ConfigError, match="attention 'cross' names T5's decoder; GPT2Model has none"):
        check_ablation(make_tiny("gpt2"), HeadAblation(((1, 2),), attention="cross"))
    with pytest.raises(ConfigError, match="unknown attention 'encoder'"):
        HeadAblation(((1, 2),), attention="encoder")
