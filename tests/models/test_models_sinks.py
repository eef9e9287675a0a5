"""Attention-sink metrics of ``probe`` against a plain Hugging Face forward
(``output_attentions``, the value projection applied by hand) and hand-built maps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from family_configs import HEADS, build, ids

from rankcollapse.data import Windows
from rankcollapse.errors import ConfigError, ModelError
from rankcollapse.models import HeadAblation, Intervention, probe
from rankcollapse.models.sinks import (SINK_THRESHOLD, contribution_weights, first_token_mass, linear_map,
                                       value_norm_ratio)

SINKS = ("sink_mass", "sink_head_fraction", "sink_value_ratio")


def _windows(x: torch.Tensor) -> Windows:
    return Windows(x, torch.ones_like(x), torch.zeros_like(x, dtype=torch.bool))


def test_first_token_mass_hand_built_and_padding():
    A = torch.zeros(2, 1, 4, 4)
    A[0, 0, :, 0] = torch.tensor([1.0, 0.5, 0.25, 0.0])  # queries 1..3 give 0.5, 0.25, 0: mean 0.25
    A[1, 0, :, 1] = torch.tensor([0.0, 1.0, 0.9, 0.6])  # sample 1 left-padded: token 1 is first
    pm = torch.tensor([[True] * 4, [False, True, True, True]])
    got = first_token_mass(A, pm)
    assert got[:, 0].tolist() == pytest.approx([0.25, 0.75], abs=1e-15)
    with pytest.raises(ModelError, match="at least 2 real tokens"):
        first_token_mass(A[:1], torch.tensor([[True, False, False, False]]))


def test_value_norm_ratio_hand_built_with_grouped_heads():
    # 2 key/value heads of width 2, 4 query heads: heads 0, 1 read kv 0; heads 2, 3 read kv 1
    V = torch.zeros(1, 4, 4, dtype=torch.float64)
    V[0, :, :2] = torch.tensor([[0.1, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0]], dtype=torch.float64)  # median (1 + 2) / 2
    V[0, :, 2:] = torch.tensor([[0.0, 8.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    got = value_norm_ratio(V, 4, 2, torch.ones(1, 4, dtype=torch.bool))
    assert got[0].tolist() == pytest.approx([0.1 / 1.5, 0.1 / 1.5, 8.0, 8.0], rel=1e-15)


@torch.no_grad()
def _reference(model, x, family):
    """Per block: attention mass on token 0 (queries 1..N-1) and ||v_0|| / median ||v_j||
    per head, from a plain forward and the value projection applied by hand."""
    out = model(input_ids=x, output_attentions=True, output_hidden_states=True)
    blocks = model.layers if family == "llama" else model.encoder.layer
    rows = []
    for k, A in enumerate(out.attentions):
        h = out.hidden_states[k]
        if family == "llama":
            attn = blocks[k].self_attn
            V, dim = attn.v_proj(blocks[k].input_layernorm(h)), attn.head_dim
        else:
            attn = blocks[k].attention.self
            V, dim = attn.value(h), attn.attention_head_size
        mass = A[:, :, 1:, 0].double().mean(-1).numpy()  # (B, H)
        norms = V.double().reshape(*V.shape[:2], -1, dim).norm(dim=-1).numpy()  # (B, N, n_kv)
        ratio = norms[:, 0] / np.median(norms, axis=1)  # (B, n_kv)
        rows.append((mass, np.repeat(ratio, HEADS // ratio.shape[1], axis=1)))
    return rows


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_probe_sinks_match_a_plain_forward(family):
    model = build(family, attn_implementation="eager")
    x = ids(3, 10)
    table = probe(model, _windows(x), metrics=SINKS, per_window=True)
    for k, (mass, ratio) in enumerate(_reference(model, x, family)):
        point = f"layer.{k}.attention"
        row = lambda p, m: table[(table.point == p) & (table.metric == m)].iloc[0]  # noqa: E731
        for h in range(HEADS):
            np.testing.assert_allclose(row(f"{point}.head_{h}", "sink_mass")["values"], mass[:, h], rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(row(f"{point}.head_{h}", "sink_value_ratio")["values"], ratio[:, h], rtol=1e-5)
        np.testing.assert_allclose(row(point, "sink_mass")["values"], mass.mean(1), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(row(point, "sink_head_fraction")["values"], (mass >= SINK_THRESHOLD).mean(1))
        assert row(point, "sink_mass")["layer"] == k + 1


def test_sinks_and_token_metrics_in_one_probe():
    model = build("bert", attn_implementation="eager")
    table = probe(model, _windows(ids(2, 8)), metrics=("mu", "sink_mass"))
    assert set(table.metric) == {"mu", "sink_mass"}
    assert set(table[table.metric == "mu"].point) >= {"embeddings", "layer.2.output"}


def test_contribution_weights_closed_forms():
    g = torch.Generator().manual_seed(0)
    A = torch.softmax(torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64), dim=-1)
    U = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64)
    C = contribution_weights(A, U)
    np.testing.assert_allclose(C.sum(dim=(1, 3)).numpy(), 1.0, rtol=1e-12)  # the terms' projections add up to y_i
    U0 = U.clone()
    U0[:, 1, 2] = 0  # key 2 writes nothing in head 1
    C0 = contribution_weights(A, U0)
    assert (C0[:, 1, :, 2] == 0).all() and (C0[:, 0, :, 2] != 0).all()
    one = contribution_weights(A[:, :1], U[:, :1, :1].expand(-1, -1, 5, -1))  # one head, equal values
    np.testing.assert_allclose(one.numpy(), A[:, :1].numpy(), rtol=1e-12)
    same = contribution_weights(A, U[:, :1, :1].expand(-1, 3, 5, -1))  # one value for every head and key
    np.testing.assert_allclose(same.numpy(), A.numpy() / 3, rtol=1e-12)


def test_contribution_weights_hand_computed():
    # one query, two keys, two heads: a = (0.75, 0.25) and (0.5, 0.5); head 0 writes
    # u_0 = (1, 0), u_1 = (0, 2); head 1 writes (0, 0), (2, 0) -> y = (0.75, 0.5) + (1, 0)
    # = (1.75, 0.5), ||y||^2 = 3.3125; c = a <u, y> / ||y||^2
    A = torch.tensor([[[[0.75, 0.25]], [[0.5, 0.5]]]], dtype=torch.float64)
    U = torch.tensor([[[[1.0, 0.0], [0.0, 2.0]], [[0.0, 0.0], [2.0, 0.0]]]], dtype=torch.float64)
    got = contribution_weights(A, U)[0, :, 0]
    want = [[0.75 * 1.75 / 3.3125, 0.25 * 1.0 / 3.3125], [0.0, 0.5 * 3.5 / 3.3125]]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-15)


def test_linear_map_reads_linear_and_conv1d():
    gpt2 = build("gpt2")
    conv = gpt2.h[0].attn.c_proj  # Conv1D: x @ weight + bias
    np.testing.assert_allclose(linear_map(conv, 32).numpy(), conv.weight.double().detach().numpy(), rtol=1e-6, atol=1e-7)
    lin = torch.nn.Linear(6, 3)
    np.testing.assert_allclose(linear_map(lin, 6).numpy(), lin.weight.double().detach().T.numpy(), rtol=1e-6, atol=1e-7)


@torch.no_grad()
def _contribution_reference(model, x, family, ablated=None):
    """Per block, the first token's contribution weight per window and head, by loops over
    queries from a plain forward: u^h_j = W_O^h v^h_j (o_proj's columns of head h),
    y_i = sum_h sum_j a^h_ij u^h_j, c^h_i0 = a^h_i0 <u^h_0, y_i> / ||y_i||^2, averaged over queries 1..N-1.
    ``ablated``: block -> heads whose u^h is 0 (the forward pass runs with the caller's hooks)."""
    out = model(input_ids=x, output_attentions=True, output_hidden_states=True)
    rows = []
    for k, A in enumerate(out.attentions):
        h = out.hidden_states[k]
        if family == "llama":
            attn = model.layers[k].self_attn
            V, dim, W = attn.v_proj(model.layers[k].input_layernorm(h)), attn.head_dim, attn.o_proj.weight
        else:
            attn = model.encoder.layer[k].attention
            V, dim, W = attn.self.value(h), attn.self.attention_head_size, attn.output.dense.weight
        V, W, A = V.double().numpy(), W.double().numpy(), A.double().numpy()
        B, H, N, _ = A.shape
        n_kv = V.shape[-1] // dim
        got = np.zeros((B, H))
        for b in range(B):
            u = [V[b, :, (hd // (H // n_kv)) * dim:(hd // (H // n_kv) + 1) * dim] @ W[:, hd * dim:(hd + 1) * dim].T
                 * (hd not in (ablated or {}).get(k, ())) for hd in range(H)]  # per head (N, d)
            for i in range(1, N):
                y = sum(A[b, hd, i] @ u[hd] for hd in range(H))
                for hd in range(H):
                    got[b, hd] += A[b, hd, i, 0] * (u[hd][0] @ y) / (y @ y) / (N - 1)
        rows.append(got)
    return rows


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_probe_sink_contribution_matches_a_hand_computation(family):
    model = build(family, attn_implementation="eager")
    x = ids(2, 7)
    table = probe(model, _windows(x), metrics=("sink_mass", "sink_contribution"), per_window=True)
    row = lambda p, m: table[(table.point == p) & (table.metric == m)].iloc[0]  # noqa: E731
    for k, ref in enumerate(_contribution_reference(model, x, family)):
        point = f"layer.{k}.attention"
        for h in range(HEADS):
            np.testing.assert_allclose(row(f"{point}.head_{h}", "sink_contribution")["values"], ref[:, h],
                                       rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(row(point, "sink_contribution")["values"], ref.sum(1), rtol=1e-5, atol=1e-6)


def test_a_first_token_value_edited_to_zero_contributes_nothing():
    """The probe's value edit (module:PATH at block 0's value projection) zeroes the first
    token's values: its contribution at block 0 is exactly 0 while its attention is unchanged."""
    model = build("llama", attn_implementation="eager")
    x = ids(2, 7)

    def no_first_value(V, ctx):
        V = V.clone()
        V[:, 0] = 0
        return V

    metrics = ("sink_mass", "sink_contribution")
    plain = probe(model, _windows(x), metrics=metrics)
    edited = probe(model, _windows(x), Intervention(edits={"module:layers.0.self_attn.v_proj": no_first_value}),
                   metrics=metrics)
    row = lambda t, m: t[(t.point == "layer.0.attention") & (t.metric == m)]["mean"].iloc[0]  # noqa: E731
    assert row(edited, "sink_contribution") == 0.0 and row(plain, "sink_contribution") != 0.0
    assert row(edited, "sink_mass") == row(plain, "sink_mass")


def test_sink_contribution_leaves_out_zero_ablated_heads():
    """A zero-ablated head writes nothing: its contribution is 0 and the layer output y_i
    holds the other heads only (hand computation under a hand-written hook); later blocks
    see the ablated model."""
    model = build("llama", attn_implementation="eager")
    x = ids(2, 7)
    dim = model.config.hidden_size // HEADS

    def zero_head_2(module, args):
        Z = args[0].clone()
        Z[..., 2 * dim: 3 * dim] = 0
        return (Z,) + args[1:]

    handle = model.layers[1].self_attn.o_proj.register_forward_pre_hook(zero_head_2)
    try:
        reference = _contribution_reference(model, x, "llama", ablated={1: [2]})
    finally:
        handle.remove()
    table = probe(model, _windows(x), metrics=("sink_mass", "sink_contribution"), per_window=True,
                  intervention=Intervention(ablate_heads=HeadAblation(((1, 2),))))
    row = lambda p, m: table[(table.point == p) & (table.metric == m)].iloc[0]  # noqa: E731
    assert np.all(row("layer.1.attention.head_2", "sink_contribution")["values"] == 0)
    for k, ref in enumerate(reference):
        point = f"layer.{k}.attention"
        for h in range(HEADS):
            np.testing.assert_allclose(row(f"{point}.head_{h}", "sink_contribution")["values"], ref[:, h],
                                       rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(row(point, "sink_contribution")["values"], ref.sum(1), rtol=1e-5, atol=1e-6)


def test_sink_contribution_refuses_heads_that_are_no_sum_over_keys():
    model = build("llama", attn_implementation="eager")
    w = _windows(ids(2, 7))
    with pytest.raises(ConfigError, match="ablate_heads mode 'mean' sets heads to their mean output"):
        probe(model, w, Intervention(ablate_heads=HeadAblation(((1, 2),), mode="mean")), metrics=("sink_contribution",))
    with pytest.raises(ConfigError, match="sink_contribution cannot be measured with the edit at layer.0.heads"):
        probe(model, w, Intervention(edits={"layer.0.heads": lambda Z, ctx: Z}), metrics=("sink_contribution",))
