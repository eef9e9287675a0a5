"""Recorder and probe on tiny random models of every family: recorded points equal the
model's own hidden_states, the sublayer points add up, the tidy table is complete."""

import dataclasses

import numpy as np
import pytest
import torch

from rankcollapse.errors import ModelError
from rankcollapse.metrics import compute_metrics
from rankcollapse.models import TABLE_COLUMNS, Recorder, default_points, embed, model_inputs, probe
from rankcollapse.models.families import stacks


def _hidden_states(loaded, windows):
    with torch.no_grad():
        out = loaded.model(**model_inputs(loaded, windows.input_ids, windows.attention_mask), output_hidden_states=True)
    if loaded.family == "t5":
        return {"encoder.": out.encoder_hidden_states, "decoder.": out.decoder_hidden_states}
    return {"": out.hidden_states}


def test_recorder_equals_hidden_states(tiny, windows):
    hs = _hidden_states(tiny, windows)
    with Recorder(tiny) as rec, torch.no_grad():
        tiny.model(**model_inputs(tiny, windows.input_ids, windows.attention_mask))
    for stack in stacks(tiny.model, tiny.family):
        states = hs[stack.prefix]
        L = stack.n_layers
        assert len(states) == L + 1
        for i, h in enumerate(states):
            if i == 0:
                name = "embeddings"
            elif i == L and stack.final_norm is not None:
                name = "final_norm"  # the last hidden state is taken after the final norm
            else:
                name = f"layer.{i - 1}.output"
            torch.testing.assert_close(rec.outputs[stack.prefix + name], h, atol=1e-6, rtol=0)
        if stack.final_norm is not None:  # and the raw last block output really differs
            raw = rec.outputs[f"{stack.prefix}layer.{L - 1}.output"]
            assert (raw - states[L]).abs().max() > 1e-3


def test_pre_ln_block_is_sum_of_recorded_sublayers(make_tiny, make_windows_tiny):
    for kind in ("llama", "gpt2"):
        loaded, w = make_tiny(kind), make_windows_tiny()
        names = default_points(loaded, "all")
        with Recorder(loaded, names) as rec, torch.no_grad():
            loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
        o = rec.outputs
        for k in range(3):
            total = o[f"layer.{k}.input"] + o[f"layer.{k}.attn_output"] + o[f"layer.{k}.mlp_output"]
            torch.testing.assert_close(o[f"layer.{k}.output"], total, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(o[f"layer.{k + 1}.input"] if k < 2 else o["layer.2.output"], o[f"layer.{k}.output"])


def test_post_ln_block_output_is_second_norm(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("bert"), make_windows_tiny()
    with Recorder(loaded, default_points(loaded, "all")) as rec, torch.no_grad():
        loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
    for k in range(3):
        assert torch.equal(rec.outputs[f"layer.{k}.norm_2"], rec.outputs[f"layer.{k}.output"])
        ln = loaded.model.encoder.layer[k].attention.output.LayerNorm
        ref = ln(rec.outputs[f"layer.{k}.input"] + rec.outputs[f"layer.{k}.attn_output"])
        torch.testing.assert_close(rec.outputs[f"layer.{k}.norm_1"], ref, atol=1e-6, rtol=1e-6)


def test_albert_shared_layer_gives_one_output_per_depth(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("albert"), make_windows_tiny()
    with Recorder(loaded) as rec, torch.no_grad():
        loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
    outs = [rec.outputs[f"layer.{k}.output"] for k in range(3)]
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], outs[2])


def test_generic_family_records_block_outputs(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("distilbert"), make_windows_tiny()
    assert loaded.family == "generic"
    hs = _hidden_states(loaded, w)[""]
    with Recorder(loaded) as rec, torch.no_grad():
        loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
    for i, h in enumerate(hs):
        torch.testing.assert_close(rec.outputs["embeddings" if i == 0 else f"layer.{i - 1}.output"], h, atol=1e-6, rtol=0)


def _summation_order_atol(X: torch.Tensor, k: int) -> float:
    """Largest difference two summation orders of the same length-``k`` dot products may
    give in ``X.dtype``: each is within ``k * u * sum|a_i b_i|`` of the exact value (Higham,
    *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 3.5; u = eps / 2), so
    they differ by at most ``k * eps * sum|a_i b_i|``; ``max|X|`` stands for the sum of
    magnitudes, times 4 for cancellation. A matrix product's blocking, and so its order,
    follows the batch size and the thread count."""
    return 4 * k * torch.finfo(X.dtype).eps * X.abs().max().item()


def test_embed_is_first_hidden_state_and_stops_early(tiny, windows):
    X = embed(tiny, windows, batch_size=2)
    prefix = stacks(tiny.model, tiny.family)[0].prefix
    ref = _hidden_states(tiny, windows)[prefix][0]
    # Batches of 2 and of 3 windows: an embedding with a projection (ALBERT maps width 16
    # to 32) sums its products in another order; a lookup or a row-wise norm is exact.
    k = getattr(tiny.model.config, "embedding_size", 1)
    torch.testing.assert_close(X, ref, atol=_summation_order_atol(ref, k), rtol=0)
    assert X.shape == (3, 10, 32)


def test_probe_table_complete_and_matches_direct_metrics(tiny, windows):
    df = probe(tiny, windows, batch_size=2)
    assert list(df.columns) == list(TABLE_COLUMNS)
    hs = _hidden_states(tiny, windows)
    for stack in stacks(tiny.model, tiny.family):
        L = stack.n_layers
        top = f"{stack.prefix}final_norm" if stack.final_norm is not None else f"{stack.prefix}layer.{L - 1}.output"
        pad = windows.attention_mask.bool()
        if stack.prefix == "decoder.":
            pad = torch.cat([torch.ones(3, 1, dtype=torch.bool), pad[:, :-1]], dim=1)
        direct = compute_metrics(hs[stack.prefix][L], ["mu", "sigma_min"], padding_mask=pad, dtype=torch.float64)
        for metric in ("mu", "sigma_min"):
            row = df[(df.point == top) & (df.metric == metric)]
            assert len(row) == 1 and int(row.layer.iloc[0]) == L and int(row.n_samples.iloc[0]) == 3
            np.testing.assert_allclose(row["mean"].iloc[0], direct[metric].mean().item(), rtol=1e-6)
        layers = sorted(df[df.point.str.startswith(stack.prefix)].layer.unique()) if stack.prefix else sorted(df.layer.unique())
        assert layers == list(range(L + 1))


def test_probe_per_window_values_are_each_windows_own_probe(tiny, windows):
    """Batched per-window values equal one probe call per window, and their mean is the row's mean."""
    metrics = ["mu", "sigma_min"]
    df = probe(tiny, windows, metrics=metrics, batch_size=2, per_window=True)
    assert list(df.columns) == list(TABLE_COLUMNS) + ["values"]
    for j in range(windows.n_samples):
        one = dataclasses.replace(windows, **{f.name: getattr(windows, f.name)[j:j + 1] for f in dataclasses.fields(windows)})
        own = probe(tiny, one, metrics=metrics, batch_size=1)
        got = np.array([v[j] for v in df["values"]])
        np.testing.assert_allclose(got, own["mean"].to_numpy(), rtol=1e-5)
    means = np.array([v.mean() for v in df["values"]])
    np.testing.assert_allclose(df["mean"].to_numpy(), means, rtol=1e-12)
    assert all(v.shape == (windows.n_samples,) and v.dtype == np.float64 for v in df["values"])


def test_padding_is_excluded_from_metrics(make_tiny, make_windows_tiny):
    loaded = make_tiny("bert")
    w = make_windows_tiny(n_windows=1, length=10, pad_last=4)
    df = probe(loaded, w, metrics=["mu"])
    with Recorder(loaded) as rec, torch.no_grad():
        loaded.model(**model_inputs(loaded, w.input_ids, w.attention_mask))
    X = rec.outputs["layer.2.output"][0, :6].double()
    mu_ref = torch.linalg.norm(X - X.mean(0, keepdim=True))
    got = df[(df.point == "layer.2.output")]["mean"].iloc[0]
    np.testing.assert_allclose(got, mu_ref.item(), rtol=1e-6)


def test_unknown_point_is_a_model_error(make_tiny):
    with pytest.raises(ModelError, match="layer.9.output"):
        Recorder(make_tiny("llama"), ["layer.9.output"])
