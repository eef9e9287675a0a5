"""Interventions on tiny random models: exact no-ops, masked attention weights exactly
zero, temperature in closed form, dropped components against hand-built references."""

import pytest
import torch

from rankcollapse.errors import ConfigError, MaskError, ModelError
from rankcollapse.models import (Intervention, Recorder, attention_maps, attention_only, capture_states, intervene,
                                 model_inputs, probe)
from rankcollapse.models.interventions import additive_mask, parse_drop


def _run(loaded, w, **kw):
    with torch.no_grad(), intervene(loaded, attention_mask=w.attention_mask, **kw):
        return loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask), output_attentions=True)


def _last(out):
    return out.encoder_last_hidden_state if hasattr(out, "encoder_last_hidden_state") else out.last_hidden_state


def test_scale_one_reproduces_model_exactly(tiny, windows):
    base, same = _run(tiny, windows), _run(tiny, windows, d_qk_scale=1.0)
    assert torch.equal(base.last_hidden_state, same.last_hidden_state)
    assert not torch.equal(base.last_hidden_state, _run(tiny, windows, d_qk_scale=4.0).last_hidden_state)


def test_own_pattern_as_mask_changes_nothing(tiny, windows):
    causal = tiny.family in ("gpt2", "llama")
    spec = "causal" if causal else "complete"
    base = _run(tiny, windows)
    torch.testing.assert_close(_last(_run(tiny, windows, mask=spec)), _last(base), atol=1e-5, rtol=1e-5)


def test_masked_attention_weights_are_exactly_zero(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("llama"), make_windows_tiny(pad_last=0)
    out = _run(loaded, w, mask="causal_sliding_window:w=3")
    n = w.n_tokens
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    allowed = (j <= i) & (j > i - 3)
    for A in out.attentions:  # (B, H, N, N)
        assert torch.all(A[..., ~allowed] == 0)
        torch.testing.assert_close(A.sum(-1), torch.ones_like(A.sum(-1)))


def test_padding_keys_get_zero_weight_under_a_replacement_mask(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("bert"), make_windows_tiny(pad_last=3)
    A = _run(loaded, w, mask="sliding_window:w=5").attentions[0]
    assert torch.all(A[-1, :, :7, -3:] == 0)  # real queries; all-padding rows are excluded from metrics


def test_temperature_scales_layer0_logits_in_closed_form(make_tiny, make_windows_tiny):
    # A = softmax(z); with scale s the first layer gives softmax(z / sqrt(s)) = softmax(log A / sqrt(s)).
    loaded, w = make_tiny("bert"), make_windows_tiny(pad_last=0)
    s = 3.0
    A = _run(loaded, w).attentions[0].double()
    A_s = _run(loaded, w, d_qk_scale=s).attentions[0].double()
    torch.testing.assert_close(A_s, torch.softmax(torch.log(A) / s**0.5, dim=-1), atol=1e-6, rtol=1e-5)


def test_drop_mlp_pre_ln_block_is_input_plus_attention(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("llama"), make_windows_tiny()
    names = ["layer.0.input", "layer.0.attn_output", "layer.0.mlp_output", "layer.0.output"]
    with intervene(loaded, drop="mlp"), Recorder(loaded, names) as rec, torch.no_grad():
        loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
    o = rec.outputs
    assert torch.all(o["layer.0.mlp_output"] == 0)
    assert torch.equal(o["layer.0.output"], o["layer.0.input"] + o["layer.0.attn_output"])


def test_drop_skip_and_mlp_is_attention_of_normed_input(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("llama"), make_windows_tiny(pad_last=0)
    m, n = loaded.model, w.n_tokens
    with intervene(loaded, drop=["skip", "mlp"]), Recorder(loaded, ["layer.0.input", "layer.0.output"]) as rec, torch.no_grad():
        m(**model_inputs(loaded, w.input_ids, w.attention_mask))
    X = rec.outputs["layer.0.input"]
    with torch.no_grad():
        pos = torch.arange(n)[None]
        blk = m.layers[0]
        mask4 = additive_mask(torch.ones(n, n, dtype=torch.bool).tril(), w.attention_mask, X.dtype)
        ref = blk.self_attn(blk.input_layernorm(X), attention_mask=mask4,
                            position_embeddings=m.rotary_emb(X, position_ids=pos))[0]
    torch.testing.assert_close(rec.outputs["layer.0.output"], ref, atol=1e-5, rtol=1e-5)


def test_drop_skip_post_ln_is_norm_of_attention(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("bert"), make_windows_tiny()
    names = ["layer.0.attn_output", "layer.0.norm_1"]
    with intervene(loaded, drop="skip"), Recorder(loaded, names) as rec, torch.no_grad():
        loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
    raw = rec.outputs["layer.0.attn_output"]  # what the block adds: SA(X) - X
    # LN(X + (SA(X) - X)) = LN(SA(X)): recompute SA(X) from the block input.
    with Recorder(loaded, ["layer.0.input"]) as rec0, torch.no_grad():
        loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
    sa = raw + rec0.outputs["layer.0.input"]
    ln = loaded.model.encoder.layer[0].attention.output.LayerNorm
    torch.testing.assert_close(rec.outputs["layer.0.norm_1"], ln(sa), atol=1e-5, rtol=1e-5)


def test_drop_norm_makes_norms_identity(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("gpt2"), make_windows_tiny()
    with intervene(loaded, drop="norm"), Recorder(loaded, ["layer.1.input", "layer.1.norm_1"]) as rec, torch.no_grad():
        loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
    assert torch.equal(rec.outputs["layer.1.norm_1"], rec.outputs["layer.1.input"])


def test_drop_some_blocks_of_albert_shared_layer(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("albert"), make_windows_tiny()
    names = ["layer.0.output", "layer.1.output"]
    with Recorder(loaded, names) as base, torch.no_grad():
        loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
    with intervene(loaded, drop="mlp:1"), Recorder(loaded, names) as rec, torch.no_grad():
        loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
    assert torch.equal(rec.outputs["layer.0.output"], base.outputs["layer.0.output"])
    assert not torch.allclose(rec.outputs["layer.1.output"], base.outputs["layer.1.output"])


def test_hooks_removed_after_intervention(tiny, windows):
    before = _last(_run(tiny, windows))
    _run(tiny, windows, mask="complete", d_qk_scale=2.0, drop=["mlp", "skip:0"])
    assert torch.equal(_last(_run(tiny, windows)), before)


def test_attention_only_pure_collapses_and_repeats_blocks(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("bert"), make_windows_tiny(pad_last=0)
    df = attention_only(loaded, w, depth=12, keep=(), metrics=["mu_relative"])
    mu = df.sort_values("layer")["mean"].to_numpy()
    assert len(mu) == 13 and mu[-1] < 1e-2 * mu[0]
    assert set(df.point[1:]) == {"attention_only.block.0", "attention_only.block.1", "attention_only.block.2"}


def test_probe_with_interventions_records_settings(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("t5"), make_windows_tiny()
    df = probe(loaded, w, Intervention(mask="causal", d_qk_scale=2.0, drop=["mlp"]), metrics=["mu"])
    assert df.attrs["mask"] == "causal" and df.attrs["d_qk_scale"] == 2.0
    assert df["point"].str.startswith("decoder.").any()


def test_probe_refuses_an_intervention_that_is_not_one(make_tiny, make_windows_tiny):
    with pytest.raises(ConfigError, match="rankcollapse.models.Intervention") as info:
        probe(make_tiny("gpt2"), make_windows_tiny(), "causal")
    assert info.value.argument == "intervention"


@pytest.mark.parametrize("kw, argument", [
    (dict(clip_massive="no"), "clip_massive"),  # a truthy string would clip
    (dict(drop=3), "drop"),
    (dict(drop=["mlp", 3]), "drop"),
    (dict(ablate_heads=[(1, 1)]), "ablate_heads"),
    (dict(edits={3: lambda X, ctx: X}), "edits"),
    (dict(edits=lambda X, ctx: X), "edits"),
    (dict(d_qk=-1.0), "d_qk"),
])
def test_intervention_fields_of_the_wrong_type_are_refused(kw, argument, make_tiny, make_windows_tiny):
    loaded, w = make_tiny("gpt2"), make_windows_tiny()
    for run in (lambda net: probe(loaded, w, net), lambda net: capture_states(loaded, w, net),
                lambda net: attention_maps(loaded, w, net)):
        with pytest.raises(ConfigError, match=argument) as info:
            run(Intervention(**kw))
        assert info.value.argument == argument


def test_batch_size_below_one_is_refused_and_one_metric_name_is_a_name(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("gpt2"), make_windows_tiny()
    for run in (probe, capture_states, attention_maps):
        with pytest.raises(ConfigError, match="batch_size must be an integer >= 1, got 0"):
            run(loaded, w, batch_size=0)
    df = probe(loaded, w, metrics="mu")
    assert set(df["metric"]) == {"mu"}


def test_metric_names_are_checked_before_the_model_runs(make_tiny, make_windows_tiny):
    from rankcollapse.metrics import METRICS
    from rankcollapse.models.probe import probe_metrics

    loaded, w = make_tiny("gpt2"), make_windows_tiny()
    for bad, text in ((["mu", "nosuch"], "unknown metric 'nosuch'"), ([], "metrics is empty")):
        with pytest.raises(ConfigError, match=text) as info:
            probe(loaded, w, metrics=bad)
        assert info.value.argument == "metrics"
    assert probe_metrics(["all"]) == tuple(METRICS) and probe_metrics(["mu", "sink_mass", "mu"]) == ("mu", "sink_mass")


def test_an_intervention_is_checked_against_the_windows_length():
    from rankcollapse.models.probe import as_intervention

    net = Intervention(mask=torch.ones(4, 4, dtype=torch.bool))
    assert as_intervention(net, 4) is net and as_intervention(Intervention(drop="")).drop == ""
    with pytest.raises(MaskError):
        as_intervention(net, 8)
    with pytest.raises(ConfigError, match="unknown component to drop 'nosuch'"):
        as_intervention(Intervention(drop="mlp,nosuch"))


def test_windows_that_are_a_bare_tensor_are_refused(make_tiny, make_windows_tiny):
    loaded, ids = make_tiny("gpt2"), make_windows_tiny().input_ids
    for run in (probe, capture_states, attention_maps):
        with pytest.raises(ConfigError, match="rankcollapse.data.Windows") as info:
            run(loaded, ids)
        assert info.value.argument == "windows"


@pytest.mark.parametrize(
    "kw, err, text",
    [
        (dict(mask="causal_sliding_window:w=3", size=12), MaskError, "12"),
        (dict(d_qk_scale=0.0), ConfigError, "d_qk_scale"),
        (dict(d_qk_scale=float("nan")), ConfigError, "d_qk_scale"),
        (dict(d_qk_scale=True), ConfigError, "d_qk_scale"),
        (dict(drop="dropout"), ConfigError, "dropout"),
        (dict(drop="mlp:7"), ConfigError, "outside"),
    ],
)
def test_bad_interventions(kw, err, text, make_tiny, make_windows_tiny):
    loaded, w = make_tiny("llama"), make_windows_tiny()
    size = kw.pop("size", None)
    if size is not None:
        from rankcollapse.masks import parse_mask

        kw["mask"] = parse_mask(kw["mask"], size)
    with pytest.raises(err, match=text):
        _run(loaded, w, **kw)


def test_an_unknown_generic_layout_refuses_drop(make_tiny, make_windows_tiny):
    import dataclasses

    loaded, w = dataclasses.replace(make_tiny("bert"), family="generic"), make_windows_tiny()  # blocks only
    with pytest.raises(ModelError, match="drop is not supported for the generic family"):
        _run(loaded, w, drop="mlp")


def test_parse_drop_block_lists():
    assert parse_drop("skip:0-1,3,mlp", 4) == {"skip": {0, 1, 3}, "mlp": {0, 1, 2, 3}}


@pytest.mark.parametrize("drop, message", [
    ("skip,skip", "drop: 'skip' is given twice in ['skip', 'skip']"),
    ("final_norm,final_norm", "drop: 'final_norm' is given twice in ['final_norm', 'final_norm']"),
    ("mlp,skip:0,mlp:1", "drop: 'mlp' is given twice in ['mlp', 'skip:0', 'mlp:1']"),  # every block, then block 1
    ("skip:0-2,skip:2", "drop: block 2 of 'skip' is given twice in ['skip:0-2', 'skip:2']"),
    ("skip:0-2,1", "drop: block 1 of 'skip' is given twice in ['skip:0-2,1']"),
])
def test_a_repeated_drop_entry_is_an_error(drop, message, tmp_path):
    """As ``--ablate-heads`` refuses a (layer, head) given twice: one line naming the entry, exit 2 at the CLI
    (before any model is read); blocks of one component named apart are one entry each."""
    from tests.cli._harness import run_cli

    with pytest.raises(ConfigError) as info:
        parse_drop(drop, 4)
    assert str(info.value) == message
    res = run_cli("probe", "--model", str(tmp_path / "none"), "--drop", drop, "--n-samples", "2", "--n-tokens", "8")
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [f"rankcollapse: error: {message}"]
    assert parse_drop("skip:0-1,skip:3,mlp", 4) == {"skip": {0, 1, 3}, "mlp": {0, 1, 2, 3}}


@pytest.mark.parametrize("drop, message", [
    ("mlp:0-", "bad block list '0-' in 'mlp:0-'; use e.g. 'skip:0-3,7'"),  # read as block 0
    ("skip:1-2-3", "bad block list '1-2-3' in 'skip:1-2-3'; use e.g. 'skip:0-3,7'"),
    (",", "drop ',' names no component; choose from skip, mlp, norm, final_norm"),  # dropped nothing
    (" , ", "drop ' , ' names no component; choose from skip, mlp, norm, final_norm"),
])
def test_a_malformed_drop_is_an_error(drop, message):
    with pytest.raises(ConfigError) as info:
        parse_drop(drop, 4)
    assert str(info.value) == message
    assert parse_drop("mlp:0 - 1,3", 4) == {"mlp": {0, 1, 3}} and parse_drop("", 4) == {}


def test_reversed_block_range_is_an_error():
    # 'skip:3-1' once meant an empty range, silently widened to every block.
    with pytest.raises(ConfigError, match="3-1"):
        parse_drop("skip:3-1", 4)


@pytest.mark.parametrize("drop", ["mlp:", "skip: ,", "mlp:0,skip:"])
def test_an_empty_block_list_is_an_error(drop):
    with pytest.raises(ConfigError, match=r"names no block after ':'"):
        parse_drop(drop, 4)


@pytest.mark.parametrize("kind", ["bert", "albert"])
def test_final_norm_drop_refused_without_a_final_norm(make_tiny, make_windows_tiny, kind):
    loaded, w = make_tiny(kind), make_windows_tiny()
    with pytest.raises(ModelError, match="final norm"):
        _run(loaded, w, drop="final_norm")


def test_final_norm_drop_makes_last_hidden_state_the_raw_block_output(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("gpt2"), make_windows_tiny()
    with intervene(loaded, drop="final_norm"), Recorder(loaded, ["layer.2.output", "final_norm"]) as rec, torch.no_grad():
        loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
    assert torch.equal(rec.outputs["final_norm"], rec.outputs["layer.2.output"])


def test_probe_records_drop_string_as_component_list(make_tiny, make_windows_tiny):
    df = probe(make_tiny("llama"), make_windows_tiny(), Intervention(drop="skip:0-1,mlp"), metrics=["mu"])
    assert df.attrs["drop"] == ["skip:0-1", "mlp"]
