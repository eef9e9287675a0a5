"""Measured influence on the last token (models/influence.py): exact Jacobian norms
against torch.func, the positive control (uniform attention: the rollout is the mask-only
prediction, ρ = 1), the Gaussian estimate against the exact norm, refusals,
``probe --influence``, and the rollout per batch (maps dropped) against keeping every map."""

import json
import sys

import numpy as np
import pytest
import torch
import transformers as tf

from rankcollapse.data import Windows
from rankcollapse.errors import ConfigError, ModelError
from rankcollapse.masks import influence
from rankcollapse.models.influence import COLUMNS, measure_influence

from family_configs import CONFIGS


def _full_windows(n_windows=2, length=9, seed=1):
    ids = torch.randint(1, 97, (n_windows, length), generator=torch.Generator().manual_seed(seed))
    return Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))


def _jacobian_norms(model, ids, layer):
    """``‖∂h_last/∂x_j‖_F`` per position, from torch.func on ``inputs_embeds`` (Llama:
    ``hidden_states[0]`` is the token embedding itself)."""
    x0 = model.get_input_embeddings()(ids).detach()

    def last(x):
        return model(inputs_embeds=x, output_hidden_states=True).hidden_states[layer][0, -1]

    jac = torch.func.jacrev(last)(x0)  # (d, 1, N, d)
    return jac[:, 0].detach().pow(2).sum((0, 2)).sqrt().double().numpy()


def test_exact_gradient_norms_equal_torch_func(make_tiny):
    loaded = make_tiny("llama")
    wins = _full_windows(n_windows=1)
    df = measure_influence(loaded, wins, n_probes=None)
    grad = df.attrs["profiles"]["gradient"]
    for layer in (1, 2, 3):
        ref = _jacobian_norms(loaded.model, wins.input_ids, layer)
        np.testing.assert_allclose(grad[layer - 1], ref / ref.sum(), rtol=1e-4)


def test_gaussian_estimate_is_close_to_the_exact_norm(make_tiny):
    loaded = make_tiny("gpt2")
    wins = _full_windows(n_windows=1)
    exact = measure_influence(loaded, wins, n_probes=None).attrs["profiles"]["gradient"]
    estimate = measure_influence(loaded, wins, n_probes=256, seed=3).attrs["profiles"]["gradient"]
    # relative std of the estimate of a squared norm from 256 probes ~ sqrt(2/256) ~ 0.09
    np.testing.assert_allclose(estimate, exact, rtol=0.15)


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_uniform_attention_rollout_is_the_prediction(kind, make_tiny):
    # positive control: zero query and key weights make every score 0, so each head
    # attends uniformly to the allowed keys, exactly the mask-only model
    loaded = make_tiny(kind)
    with torch.no_grad():
        for name, p in loaded.model.named_parameters():
            if any(s in name for s in ("q_proj", "k_proj", "attention.self.query", "attention.self.key")):
                p.zero_()
    df = measure_influence(loaded, _full_windows(n_windows=3), n_probes=1)
    profiles = df.attrs["profiles"]
    assert df.attrs["mask"] == ("causal" if kind == "llama" else "complete")
    np.testing.assert_allclose(profiles["rollout"], profiles["predicted"], rtol=1e-5, atol=1e-7)
    # the prediction ranks nothing under the complete mask, nor at layer 1 under the causal one
    ranked = df["layer"] > 1 if kind == "llama" else df["layer"] < 0
    assert (df.loc[ranked, "rho_rollout"] > 0.999999).all() and ranked.any() == (kind == "llama")
    assert df.loc[~ranked, ["rho_gradient", "rho_rollout", "rho_rollout_half"]].isna().all().all()
    assert df["rho_rollout_gradient"].notna().all()
    ref = influence(df.attrs["mask"], 9, depth=len(df), alpha=df["alpha"].tolist()).profiles
    np.testing.assert_allclose(profiles["predicted"], ref, rtol=1e-13)
    assert ((df["alpha"] > 0) & (df["alpha"] < 1)).all()


def test_table_columns_and_padding_left_out(make_tiny, make_windows_tiny):
    df = measure_influence(make_tiny("gpt2"), make_windows_tiny(3, 10, pad_last=3), n_probes=2)
    assert list(df.columns) == list(COLUMNS) and list(df["layer"]) == [1, 2, 3]
    assert (df["n_samples"] == 2).all()  # the padded window is left out
    for name, p in df.attrs["profiles"].items():
        assert p.shape == (3, 10)
        np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-12)


def test_refusals(make_tiny, make_windows_tiny):
    with pytest.raises(ConfigError, match="padding"):
        measure_influence(make_tiny("gpt2"), make_windows_tiny(1, 10, pad_last=3))
    with pytest.raises(ConfigError, match="n_probes"):
        measure_influence(make_tiny("gpt2"), _full_windows(), n_probes=0)
    with pytest.raises(ModelError, match="one-stack"):
        measure_influence(make_tiny("t5"), _full_windows())


def _main(monkeypatch, capsys, *args):
    from rankcollapse.cli import main

    monkeypatch.setattr(sys, "argv", ["rankcollapse", "probe", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_probe_influence(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    tf.AutoModel.from_config(CONFIGS["llama"]()).save_pretrained(tmp_path / "model")
    _full_windows(n_windows=2, length=8).save(tmp_path / "w.npz")
    base = ["--model", str(tmp_path / "model"), "--windows-file", str(tmp_path / "w.npz"), "--influence"]
    code, out, err = _main(monkeypatch, capsys, *base, "--format", "json", "--out", str(tmp_path / "out"))
    assert code == 0, err
    doc = json.loads(out)
    (model,) = doc["models"]
    assert model["mask"] == "causal" and len(model["layers"]) == 3 and len(model["profiles"]["gradient"][0]) == 8
    assert json.loads((tmp_path / "out" / "influence.json").read_text()) == doc
    assert (tmp_path / "out" / "influence.csv").read_text().startswith("model,layer,alpha,rho_gradient")
    code, out, err = _main(monkeypatch, capsys, *base, "--drop", "mlp")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--drop does not apply" in err
    code, out, err = _main(monkeypatch, capsys, *base, "--mask", "causal_sliding_window:w=3", "--format", "json")
    assert code == 0, err
    (model,) = json.loads(out)["models"]
    assert model["mask"] == "causal_sliding_window:w=3"
    assert model["profiles"]["gradient"][0][:5] == [0.0] * 5  # layer 1: the last token sees tokens 5-7 only


def test_replacement_mask_bounds_the_measured_influence(make_tiny):
    # under a causal window of 3, the last token after k blocks depends on the 2k + 1
    # tokens before it only: every profile is 0 further back, and the prediction is the mask's
    loaded, wins = make_tiny("gpt2"), _full_windows(n_windows=2)
    spec = "causal_sliding_window:w=3"
    df = measure_influence(loaded, wins, mask=spec, n_probes=None)
    assert df.attrs["mask"] == spec
    profiles = df.attrs["profiles"]
    for k in range(1, 4):
        reach = 9 - 1 - 2 * k  # positions < reach are out of reach after k blocks
        for name in ("gradient", "rollout", "predicted"):
            assert np.all(profiles[name][k - 1][:reach] == 0), (name, k)
            assert np.all(profiles[name][k - 1][reach:] > 0), (name, k)
    ref = influence(spec, 9, depth=3, alpha=df["alpha"].tolist()).profiles
    np.testing.assert_allclose(profiles["predicted"], ref, rtol=1e-12)
    plain = measure_influence(loaded, wins, n_probes=None).attrs["profiles"]
    own = measure_influence(loaded, wins, mask="causal", n_probes=None).attrs["profiles"]  # GPT-2's own mask
    np.testing.assert_allclose(own["gradient"], plain["gradient"], rtol=1e-4, atol=1e-7)


def test_alpha_is_the_residual_share_of_norms(make_tiny):
    from rankcollapse.models import Recorder

    loaded, wins = make_tiny("gpt2"), _full_windows(n_windows=2)
    df = measure_influence(loaded, wins, n_probes=1)
    points = [f"layer.{k}.{part}" for k in range(3) for part in ("input", "attn_output")]
    with torch.no_grad(), Recorder(loaded, points) as rec:
        loaded.model(input_ids=wins.input_ids, attention_mask=wins.attention_mask)
    for k in range(3):
        x, a = (rec.outputs[f"layer.{k}.{part}"].double().norm(dim=-1).mean() for part in ("input", "attn_output"))
        assert df["alpha"][k] == pytest.approx(float(x / (x + a)), rel=1e-6)


def _keep_every_map(loaded, wins, batch_size, n_probes, seed):
    """Reference: every window's head-mean maps kept to the end, alpha from the norms of
    every window, then each window's rollout (memory growing with the windows)."""
    from rankcollapse.models import families
    from rankcollapse.models import influence as inf

    stack = families.stacks(loaded.model, loaded.family)[0]
    gen = torch.Generator().manual_seed(seed)
    maps, norms, grads = [[] for _ in range(stack.n_layers)], np.zeros((stack.n_layers, 2)), []
    for i in range(0, wins.input_ids.shape[0], batch_size):
        ids, am = wins.input_ids[i:i + batch_size], wins.attention_mask[i:i + batch_size]
        with inf._forward(loaded, stack, ids, am) as (_, _, rec):
            norms += inf._norms(rec, stack)
        g, m = inf._batch(loaded, stack, ids, am, n_probes, gen)
        grads.append(g)
        for k in range(stack.n_layers):
            maps[k].extend(m[k])
    alpha = norms[:, 0] / norms.sum(1)
    rollout = inf._rollout_windows(maps, alpha)
    half = inf._rollout_windows(maps, 0.5)
    return alpha, np.concatenate(grads), rollout, inf._window_mean(rollout), inf._window_mean(half)


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_rollout_per_batch_equals_keeping_every_map(kind, make_tiny):
    # 5 windows in batches of 2: the last batch is short
    loaded, wins = make_tiny(kind), _full_windows(n_windows=5, length=12)
    df = measure_influence(loaded, wins, batch_size=2, n_probes=2, seed=4)
    alpha, grads, rollout, mean_rollout, mean_half = _keep_every_map(loaded, wins, 2, 2, 4)
    np.testing.assert_array_equal(df["alpha"].to_numpy(), alpha)
    np.testing.assert_array_equal(df.attrs["per_window"]["gradient"], grads)
    np.testing.assert_array_equal(df.attrs["per_window"]["rollout"], rollout)
    profiles = df.attrs["profiles"]
    np.testing.assert_array_equal(profiles["rollout"], mean_rollout / mean_rollout.sum(1, keepdims=True))
    np.testing.assert_array_equal(profiles["rollout_half"], mean_half / mean_half.sum(1, keepdims=True))
    assert (df["n_samples"] == 5).all()


def test_maps_kept_do_not_grow_with_the_windows(make_tiny, monkeypatch):
    # each batch's (N, N) head-mean maps are watched by weak references: the number alive
    # when a batch starts is at most one batch's worth (B · L) whatever the number of windows
    import weakref

    from rankcollapse.models import influence as inf

    batch, alive, most = inf._batch, [], []

    def watched(*args, **kwargs):
        most[-1] = max(most[-1], sum(ref() is not None for ref in alive))
        out = batch(*args, **kwargs)
        alive.extend(weakref.ref(m) for layer in out[1] for m in layer)
        return out

    monkeypatch.setattr(inf, "_batch", watched)
    loaded = make_tiny("gpt2")
    for n_windows in (4, 16):
        alive.clear()
        most.append(0)
        measure_influence(loaded, _full_windows(n_windows=n_windows), batch_size=2, n_probes=1)
    assert max(most) <= 2 * 3, most  # batch_size · L; keeping every map: 14 · 3 at the 16th window
