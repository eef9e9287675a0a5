"""Extracted pretrained attention reproduces each model's own attention module."""

import os

import pytest
import torch

from rankcollapse import assets
from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.dynamics.pretrained import extract_attention_weights
from rankcollapse.errors import ModelError

transformers = pytest.importorskip("transformers")
N, B = 12, 2


def one_layer(X, lw, mask):
    res = simulate(X, mask=mask, weights=[lw], metrics={"n": lambda Z: Z.norm(dim=(-2, -1))},
                   run=RunConfig(depth=1, record_states=True, dtype=X.dtype))
    return res.states[1]


def additive(M):
    return torch.zeros(M.shape, dtype=torch.float32).masked_fill(~M, float("-inf"))[None, None]


def test_minilm_layer_matches_bert_attention():
    model = transformers.AutoModel.from_pretrained(assets.minilm_dir(), attn_implementation="eager").eval()
    weights = extract_attention_weights(model)
    assert len(weights) == 6 and weights[0].n_heads == 12
    X = torch.randn(B, N, 384)
    layer = model.encoder.layer[2]
    with torch.no_grad():
        expected = layer.attention.output.dense(layer.attention.self(X)[0])
    torch.testing.assert_close(one_layer(X, weights[2], torch.ones(N, N, dtype=torch.bool)), expected,
                               rtol=1e-4, atol=1e-4)


def test_tiny_gpt2_layer_matches():
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, scale_attn_by_inverse_layer_idx=True)
    model = transformers.GPT2Model(cfg).eval()
    model.config._attn_implementation = "eager"
    weights = extract_attention_weights(model)
    X = torch.randn(B, N, 32)
    M = torch.ones(N, N, dtype=torch.bool).tril()
    with torch.no_grad():
        expected = model.h[1].attn(X, attention_mask=additive(M))[0]
    assert weights[1].scale == pytest.approx(8**-0.5 / 2)
    torch.testing.assert_close(one_layer(X, weights[1], M), expected, rtol=1e-4, atol=1e-5)


def test_tiny_t5_encoder_layer_matches_with_position_bias():
    cfg = transformers.T5Config(d_model=32, d_kv=8, num_heads=4, num_layers=2, d_ff=64, vocab_size=50)
    model = transformers.T5EncoderModel(cfg).eval()
    model.config._attn_implementation = "eager"
    weights = extract_attention_weights(model)
    X = torch.randn(B, N, 32)
    attn0 = model.encoder.block[0].layer[0].SelfAttention
    with torch.no_grad():
        expected = attn0(X)[0]
        bias = attn0.compute_bias(N, N)
        expected1 = model.encoder.block[1].layer[0].SelfAttention(X, position_bias=bias)[0]
    M = torch.ones(N, N, dtype=torch.bool)
    torch.testing.assert_close(one_layer(X, weights[0], M), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(one_layer(X, weights[1], M), expected1, rtol=1e-4, atol=1e-5)
    assert weights[1].scale == 1.0


def test_tiny_albert_shared_layer_matches():
    cfg = transformers.AlbertConfig(embedding_size=16, hidden_size=32, num_attention_heads=4, num_hidden_layers=3,
                                    intermediate_size=64, vocab_size=50)
    model = transformers.AlbertModel(cfg).eval()
    model.config._attn_implementation = "eager"
    weights = extract_attention_weights(model)
    assert len(weights) == 3 and torch.equal(weights[0].W_Q, weights[2].W_Q)
    X = torch.randn(B, N, 32)
    attn = model.encoder.albert_layer_groups[0].albert_layers[0].attention
    with torch.no_grad():
        expected = attn(X)[0]  # LayerNorm(X + SA(X))
        ours = attn.LayerNorm(X + one_layer(X, weights[1], torch.ones(N, N, dtype=torch.bool)))
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)


def test_unsupported_family():
    model = transformers.DistilBertModel(transformers.DistilBertConfig(dim=32, n_heads=4, n_layers=1, hidden_dim=64,
                                                                       vocab_size=50))
    with pytest.raises(ModelError, match="distilbert"):
        extract_attention_weights(model)


def llama_check(model, n_tokens=N, layer_idx=1):
    weights = extract_attention_weights(model)
    d = model.config.hidden_size
    X = torch.randn(B, n_tokens, d)
    M = torch.ones(n_tokens, n_tokens, dtype=torch.bool).tril()
    pos = torch.arange(n_tokens)[None].expand(B, -1)
    with torch.no_grad():
        pe = model.model.rotary_emb(X, pos)
        expected = model.model.layers[layer_idx].self_attn(X, position_embeddings=pe, attention_mask=additive(M))[0]
    torch.testing.assert_close(one_layer(X, weights[layer_idx], M), expected, rtol=1e-4, atol=1e-4)
    return weights


def test_tiny_llama_gqa_rope_matches():
    cfg = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                                   intermediate_size=64, vocab_size=50)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.config._attn_implementation = "eager"
    weights = llama_check(model)
    assert weights[0].n_kv_heads == 2


@pytest.mark.slow
def test_smollm2_layer_matches():
    os.environ["HF_HUB_OFFLINE"] = "1"
    folder, gguf = assets.smollm2_gguf()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    weights = llama_check(model, n_tokens=16, layer_idx=3)
    assert len(weights) == 30 and weights[0].n_heads == 9 and weights[0].n_kv_heads == 3
