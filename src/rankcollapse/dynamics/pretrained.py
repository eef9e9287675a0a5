"""Self-attention weights of pretrained Hugging Face models: every layer reduced to its
attention sublayer ``SA(X) = concat_h(softmax(q_h k_h^T * scale + bias_h) v_h) W_O + b_O``
(docs/dynamics.md, "Pretrained self-attention", gives each family's quirks). The model's
causal masking is not part of the weights: pass the mask to ``simulate``.
"""

from __future__ import annotations

import torch

from ..errors import ModelError
from ..models.families import MODEL_TYPES, albert_group, family_of
from .layer_weights import LayerWeights


def _t(linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    b = None if linear.bias is None else linear.bias.detach().clone()
    return linear.weight.detach().T.clone(), b


def _qkvo(q, k, v, o, **kw) -> LayerWeights:
    (W_Q, b_Q), (W_K, b_K), (W_V, b_V), (W_O, b_O) = map(_t, (q, k, v, o))
    return LayerWeights(W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O, **kw)


def _bert(base, cfg) -> list[LayerWeights]:
    out = []
    for i, layer in enumerate(base.encoder.layer):
        sa = layer.attention.self
        out.append(_qkvo(sa.query, sa.key, sa.value, layer.attention.output.dense, n_heads=sa.num_attention_heads,
                         scale=float(sa.scaling), meta={"family": "bert", "layer": i}))
    return out


def _albert(base, cfg) -> list[LayerWeights]:
    groups = base.encoder.albert_layer_groups
    out = []
    for i in range(cfg.num_hidden_layers):
        g = albert_group(i, cfg.num_hidden_layers, cfg.num_hidden_groups)
        for inner in groups[g].albert_layers:
            a = inner.attention
            out.append(_qkvo(a.query, a.key, a.value, a.dense, n_heads=cfg.num_attention_heads,
                             scale=float(a.attention_head_size ** -0.5),
                             meta={"family": "albert", "layer": i, "shared_group": g}))
    return out


def _gpt2(base, cfg) -> list[LayerWeights]:
    out = []
    for i, block in enumerate(base.h):
        attn = block.attn
        W, b = attn.c_attn.weight.detach(), attn.c_attn.bias.detach()  # Conv1D: (d, 3d), x @ W
        W_Q, W_K, W_V = W.split(attn.embed_dim, dim=1)
        b_Q, b_K, b_V = b.split(attn.embed_dim)
        out.append(LayerWeights(W_Q.clone(), W_K.clone(), W_V.clone(), attn.c_proj.weight.detach().clone(),
                                b_Q.clone(), b_K.clone(), b_V.clone(), attn.c_proj.bias.detach().clone(),
                                n_heads=attn.num_heads, scale=float(attn.scaling), meta={"family": "gpt2", "layer": i}))
    return out


def _t5(base, cfg) -> list[LayerWeights]:
    stack = base.encoder if hasattr(base, "encoder") else base
    first = stack.block[0].layer[0].SelfAttention

    def position_bias(n: int) -> torch.Tensor:
        with torch.no_grad():
            return first.compute_bias(n, n, device=first.q.weight.device)[0]  # (H, n, n)

    out = []
    for i, block in enumerate(stack.block):
        a = block.layer[0].SelfAttention
        out.append(_qkvo(a.q, a.k, a.v, a.o, n_heads=a.n_heads, scale=1.0, position_bias=position_bias,
                         meta={"family": "t5", "layer": i}))
    return out


def _llama(base, cfg) -> list[LayerWeights]:
    rope = base.rotary_emb
    out = []
    for i, layer in enumerate(base.layers):
        a = layer.self_attn
        out.append(_qkvo(a.q_proj, a.k_proj, a.v_proj, a.o_proj, n_heads=cfg.num_attention_heads,
                         n_kv_heads=cfg.num_key_value_heads, scale=float(a.scaling),
                         rope_inv_freq=rope.inv_freq.detach().float().clone(),
                         rope_scaling=float(getattr(rope, "attention_scaling", 1.0)),
                         meta={"family": "llama", "layer": i}))
    return out


_EXTRACTORS = {"bert": _bert, "roberta": _bert, "albert": _albert, "gpt2": _gpt2, "t5": _t5, "llama": _llama}


def model_family(hf_model) -> str:
    """``bert | roberta | albert | gpt2 | t5 | llama`` from ``config.model_type``
    (:data:`rankcollapse.models.families.REGISTRY`; Mistral, Qwen2 and Gemma are Llama). Raises
    ``ModelError``: a model type whose attention layout is not known."""
    mt = getattr(hf_model.config, "model_type", "")
    family = family_of(mt)
    if family not in _EXTRACTORS:
        raise ModelError(f"cannot extract attention weights of model_type {mt!r}; supported: {sorted(MODEL_TYPES)}")
    return family


def extract_attention_weights(hf_model) -> list[LayerWeights]:
    """Per-layer :class:`LayerWeights` (Q, K, V, O, biases, scale, RoPE, position bias), detached,
    in the model's dtype, of a ``transformers`` model (BERT, ALBERT, GPT-2, T5 encoder, Llama;
    base or with a head) or a :class:`rankcollapse.models.LoadedModel`. Raises ``ModelError``:
    unsupported family."""
    hf_model = getattr(hf_model, "model", hf_model) if not hasattr(hf_model, "config") else hf_model
    family = model_family(hf_model)
    base = getattr(hf_model, hf_model.base_model_prefix, hf_model)
    return _EXTRACTORS[family](base, hf_model.config)
