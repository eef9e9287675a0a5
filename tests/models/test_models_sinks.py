"""Attention-sink metrics of ``probe`` against a plain Hugging Face forward
(``output_attentions``, the value projection applied by hand) and hand-built maps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from family_configs import HEADS, build, ids

from rankcollapse.data import Windows
from rankcollapse.errors import ModelError
from rankcollapse.models import probe
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
    np.testing.assert_allclose(C.sum(-1).numpy(), 1.0, rtol=1e-12)  # the terms' projections add up to o_i
    U0 = U.clone()
    U0[:, :, 2] = 0  # key 2 writes nothing
    C0 = contribution_weights(A, U0)
    assert (C0[..., 2] == 0).all() and (C0[..., 3] != 0).all()
    same = U[:, :, :1].expand(-1, -1, 5, -1)  # every key writes the same vector
    np.testing.assert_allclose(contribution_weights(A, same).numpy(), A.numpy(), rtol=1e-12)


def test_contribution_weights_hand_computed():
    # one query, two keys: a = (0.75, 0.25), u_0 = (1, 0), u_1 = (0, 2) -> o = (0.75, 0.5),
    # ||o||^2 = 0.8125; c_0 = 0.75 * 0.75 / 0.8125, c_1 = 0.25 * 1.0 / 0.8125
    A = torch.tensor([[[[0.75, 0.25]]]], dtype=torch.float64)
    U = torch.tensor([[[[1.0, 0.0], [0.0, 2.0]]]], dtype=torch.float64)
    assert contribution_weights(A, U)[0, 0, 0].tolist() == pytest.approx([0.5625 / 0.8125, 0.25 / 0.8125], rel=1e-15)


def test_linear_map_reads_linear_and_conv1d():
    gpt2 = build("gpt2")
    conv = gpt2.h[0].attn.c_proj  # Conv1D: x @ weight + bias
    np.testing.assert_allclose(linear_map(conv, 32).numpy(), conv.weight.double().detach().numpy(), rtol=1e-6, atol=1e-7)
    lin = torch.nn.Linear(6, 3)
    np.testing.assert_allclose(linear_map(lin, 6).numpy(), lin.weight.double().detach().T.numpy(), rtol=1e-6, atol=1e-7)


@torch.no_grad()
def _contribution_reference(model, x, family):
    """Per block, the first token's contribution weight per window and head, by loops over
    queries from a plain forward: u_j = W_O^h v_j (o_proj's columns of head h), o_i = sum_j a_ij u_j,
    c_i0 = a_i0 <u_0, o_i> / ||o_i||^2, averaged over queries 1..N-1."""
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
            for hd in range(H):
                kv = hd // (H // n_kv)
                u = V[b, :, kv * dim:(kv + 1) * dim] @ W[:, hd * dim:(hd + 1) * dim].T  # (N, d)
                for i in range(1, N):
                    o = A[b, hd, i] @ u
                    got[b, hd] += A[b, hd, i, 0] * (u[0] @ o) / (o @ o) / (N - 1)
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
        np.testing.assert_allclose(row(point, "sink_contribution")["values"], ref.mean(1), rtol=1e-5, atol=1e-6)
