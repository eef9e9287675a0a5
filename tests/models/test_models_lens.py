"""``probe`` of a TransformerLens bridge and of an nnsight model (rankcollapse.models.lens):
the per-layer metrics are those of the library's own cache / saved outputs, and a tiny
GPT-2 (and a tiny Llama) gives the same table as a transformers model, a TransformerLens
model and an nnsight model (unprocessed weights), padding included."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers as tf

from rankcollapse.models import HeadAblation
from rankcollapse.data import Windows
from rankcollapse.errors import ConfigError, ModelError
from rankcollapse.metrics import compute_metrics
from rankcollapse.models import Intervention, probe
from rankcollapse.models.lens import library_model

nnsight = pytest.importorskip("nnsight", reason="nnsight is in the interp extra (make setup installs it)")
sources = pytest.importorskip("transformer_lens.model_bridge.sources",
                              reason="transformer-lens is in the interp extra (make setup installs it)")

METRICS = ["mu", "mu_relative", "rank_fraction", "sigma_min", "avg_abs_cos"]
N_LAYERS = 2


@pytest.fixture(scope="module")
def gpt2() -> tf.GPT2LMHeadModel:
    """A tiny GPT-2 with random LayerNorm scales and biases (so a final norm's affine map
    shows in its output); callers get a copy, since a bridge changes its model in place."""
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=61, n_embd=16, n_layer=N_LAYERS, n_head=2, n_positions=32, bos_token_id=0,
                           eos_token_id=0)
    model = tf.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or "ln_f" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def llama() -> tf.LlamaForCausalLM:
    """A tiny Llama (RMSNorm, rotary positions: no position embeddings)."""
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=N_LAYERS,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return tf.LlamaForCausalLM(config).eval()


def bridge(model: tf.PreTrainedModel):
    """TransformerLens's own offline route from a transformers model (a copy) to a bridge;
    its architecture names are the transformers class names."""
    return sources.build_bridge_from_module(copy.deepcopy(model), type(model).__name__, hf_config=model.config)


@pytest.fixture
def windows() -> Windows:
    """Four windows of 20 tokens: one right-padded (3 pads), one left-padded (4 pads)."""
    ids = torch.randint(1, 61, (4, 20), generator=torch.Generator().manual_seed(1))
    am = torch.ones_like(ids)
    am[1, -3:] = 0
    am[2, :4] = 0
    return Windows(ids, am, torch.zeros_like(ids, dtype=torch.bool))


def per_window(df, point: str, metric: str) -> np.ndarray:
    row = df[(df["point"] == point) & (df["metric"] == metric)]
    assert len(row) == 1, (point, metric)
    return np.asarray(row["values"].iloc[0])


def assert_metrics_of(df, tensors: dict[str, torch.Tensor], am: torch.Tensor) -> None:
    """Every row of ``df`` holds the metrics of ``tensors[point]`` ``(B, N, d)`` over real tokens."""
    assert set(df["point"]) == set(tensors)
    for point, X in tensors.items():
        direct = compute_metrics(X.detach(), METRICS, padding_mask=am.bool(), dtype=torch.float64)
        for metric in METRICS:
            np.testing.assert_allclose(per_window(df, point, metric), direct[metric].numpy(), rtol=1e-9, atol=1e-12)


def test_a_transformer_lens_bridge_is_probed_at_its_cached_residual_stream(gpt2, windows):
    model = bridge(gpt2)
    df = probe(model, windows, metrics=METRICS, per_window=True, progress=False)
    names = {"embeddings": "blocks.0.hook_resid_pre", "final_norm": "ln_final.hook_out",
             **{f"layer.{k}.output": f"blocks.{k}.hook_resid_post" for k in range(N_LAYERS)}}
    with torch.no_grad():
        _, cache = model.run_with_cache(windows.input_ids, attention_mask=windows.attention_mask, return_type=None)
    assert_metrics_of(df, {p: cache[h] for p, h in names.items()}, windows.attention_mask)
    # embeddings are TransformerLens's token plus position embeddings
    assert_metrics_of(df[df["point"] == "embeddings"], {"embeddings": cache["hook_embed"] + cache["hook_pos_embed"]},
                      windows.attention_mask)
    # the bridge's hook_normalized is before the final norm's scale and bias; hook_out after them
    assert not torch.allclose(cache["ln_final.hook_normalized"], cache["ln_final.hook_out"], atol=1e-2)
    assert list(df["layer"].drop_duplicates()) == [0, 1, 2]
    assert df.attrs["library"] == "transformer_lens" and df.attrs["family"] == "gpt2"
    assert "blocks.k.hook_resid_post" in df.attrs["notes"][0] and len(df.attrs["notes"]) == 1


def test_processed_weights_are_recorded_as_transformer_lens_computes_them(gpt2, windows):
    """Compatibility mode (fold_ln, centred writing weights): the table is that of the processed
    model's cache, whose residual vectors have mean 0 over d, and the notes say so."""
    model = bridge(gpt2)
    model.enable_compatibility_mode(disable_warnings=True)
    df = probe(model, windows, metrics=METRICS, per_window=True, progress=False)
    with torch.no_grad():
        _, cache = model.run_with_cache(windows.input_ids, attention_mask=windows.attention_mask, return_type=None)
    resid = cache["blocks.1.hook_resid_post"]
    assert resid.mean(dim=-1).abs().max() < 1e-5 * resid.abs().max()  # centred: the processed model's stream
    assert_metrics_of(df[df["point"] == "layer.1.output"], {"layer.1.output": resid}, windows.attention_mask)
    assert any("processed the weights" in note for note in df.attrs["notes"])
    plain = probe(copy.deepcopy(gpt2), windows, metrics=["avg_abs_cos"], progress=False)
    assert not np.allclose(df[df["metric"] == "avg_abs_cos"]["mean"], plain["mean"], rtol=1e-3)


def word_tokenizer(vocab_size: int) -> tf.PreTrainedTokenizerFast:
    """A word-level tokenizer ``t0 ... t{vocab_size-1}``, built offline (TransformersModel wants one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0")


@pytest.mark.parametrize("wrapper", ["NNsight", "TransformersModel"])
def test_an_nnsight_model_is_probed_at_its_saved_outputs(gpt2, windows, wrapper):
    if wrapper == "NNsight":
        model = nnsight.NNsight(copy.deepcopy(gpt2))
    else:
        model = nnsight.TransformersModel(copy.deepcopy(gpt2), tokenizer=word_tokenizer(gpt2.config.vocab_size))
    df = probe(model, windows, metrics=METRICS, per_window=True, progress=False)
    am = windows.attention_mask
    positions = torch.where(am.bool(), am.cumsum(-1) - 1, 0)  # the k-th real token at position k
    with model.trace(input_ids=windows.input_ids, attention_mask=am, position_ids=positions):
        x0 = model.transformer.h[0].input.save()
        h0 = model.transformer.h[0].output.save()
        h1 = model.transformer.h[1].output.save()
        ln = model.transformer.ln_f.output.save()
    assert_metrics_of(df, {"embeddings": x0, "layer.0.output": h0, "layer.1.output": h1, "final_norm": ln}, am)
    assert df.attrs["library"] == "nnsight" and "nnsight" in df.attrs["notes"][0]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_one_model_gives_one_table_as_transformers_transformer_lens_and_nnsight_model(kind, request, windows):
    """Same weights, same padding (left and right): the tables agree to float32 rounding."""
    model = request.getfixturevalue(kind)
    tables = [probe(m, windows, metrics=METRICS, progress=False)
              for m in (copy.deepcopy(model), bridge(model), nnsight.NNsight(copy.deepcopy(model)))]
    reference = tables[0]
    assert list(reference["point"].drop_duplicates()) == ["embeddings", "layer.0.output", "layer.1.output",
                                                          "final_norm"]
    for table in tables[1:]:
        assert table[["layer", "point", "metric", "n_samples"]].equals(reference[["layer", "point", "metric",
                                                                                  "n_samples"]])
        for column in ("mean", "q50"):  # float32 hidden states: ~100 eps
            np.testing.assert_allclose(table[column], reference[column], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("change, option", [({"mask": "causal"}, {}), ({"drop": "mlp"}, {}), ({"d_qk_scale": 2.0}, {}),
                                            ({}, {"points": "all"}), ({}, {"metrics": ["attention_entropy"]}),
                                            ({"edits": {"layer.0.output": lambda Z, ctx: Z}}, {}),
                                            ({"ablate_heads": HeadAblation(((0, 0),))}, {})])
def test_interventions_and_attention_metrics_are_refused(gpt2, windows, change, option):
    for model in (bridge(gpt2), nnsight.NNsight(copy.deepcopy(gpt2))):
        with pytest.raises(ConfigError, match="not available for a (transformer_lens|nnsight) model"):
            probe(model, windows, Intervention(**change), progress=False, **option)


def test_windows_the_model_cannot_take_are_refused_before_a_forward_pass(gpt2):
    ids = torch.full((1, 40), 3)  # 40 tokens > 32 positions
    long = Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))
    for model in (bridge(gpt2), nnsight.NNsight(copy.deepcopy(gpt2))):
        with pytest.raises(ConfigError, match="exceed"):
            probe(model, long, progress=False)


def test_only_library_models_take_the_library_route(gpt2):
    assert library_model(gpt2) is None
    with pytest.raises(ModelError, match="transformers"):
        library_model(nnsight.NNsight(torch.nn.Linear(3, 3)))


@pytest.mark.parametrize("kind", ["bert", "t5", "llama", "roberta", "distilbert"])
def test_an_nnsight_model_gives_the_transformers_table_in_every_family(kind, make_tiny, make_windows_tiny):
    """Encoders, T5's two stacks and decoders: nnsight records the probe's points of the same
    forward pass (the probe's model inputs), so the tables are equal; windows with padding."""
    windows = make_windows_tiny()
    reference = probe(make_tiny(kind), windows, metrics=METRICS, progress=False)
    table = probe(nnsight.NNsight(make_tiny(kind).model), windows, metrics=METRICS, progress=False)
    assert table[["layer", "point", "metric", "n_samples"]].equals(reference[["layer", "point", "metric", "n_samples"]])
    np.testing.assert_allclose(table["mean"], reference["mean"], rtol=1e-9, atol=1e-12, equal_nan=True)


def test_an_nnsight_model_with_a_shared_block_is_refused(make_tiny):
    with pytest.raises(ModelError, match="runs one module as several blocks"):
        library_model(nnsight.NNsight(make_tiny("albert").model))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_parity_of_a_bridge_against_the_wrapped_models_hidden_states(name, request, windows):
    """Each cached point of an unprocessed bridge equals the wrapped model's hidden_states
    within the float32 bound (right padding: a plain transformers call numbers a
    left-padded window's positions from its first slot, the bridge from its first real
    token); the table labels every hidden_states entry."""
    from rankcollapse.models import check_parity, parity

    model = bridge(request.getfixturevalue(name))
    right = windows.attention_mask.clone()
    right[2] = 1  # the left-padded window, unpadded
    table = parity(model, Windows(windows.input_ids, right, windows.special_tokens_mask), batch_size=2)
    assert list(table["point"]) == ["embeddings", *[f"layer.{k}.output" for k in range(N_LAYERS - 1)], "final_norm"]
    assert table["ok"].all() and (table["max_abs"] > 0).all()
    assert table.attrs["recorded_by"] == "transformer_lens"
    check_parity(table)


def test_parity_of_a_bridge_with_processed_weights_fails_loudly(gpt2, windows):
    """Compatibility mode centres the residual stream: far above the float32 bound."""
    from rankcollapse.models import check_parity, parity

    model = bridge(gpt2)
    model.enable_compatibility_mode(disable_warnings=True)
    table = parity(model, windows)
    assert not table["ok"].all()
    with pytest.raises(ModelError, match="parity with transformers"):
        check_parity(table)
