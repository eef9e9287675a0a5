"""The model-family registry, and where each family keeps its blocks, sublayers and norms.

Per stack (two for T5), the blocks in the order they are *called* (ALBERT's shared
layer appears L times) and, per block, the modules the recorder and the interventions
attach to. Nothing here changes a model. The point names (shared with simulations
through :mod:`rankcollapse.points`; T5 prefixes ``encoder.`` / ``decoder.``) are listed
in docs/models.md, "Point names".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..errors import ModelError
from ..points import block_output, layer_of, point_after


@dataclass(frozen=True)
class Family:
    """What the toolkit knows about one model family (the one registry that loading,
    recording, interventions and the weight extraction read): its ``model_types``, whether
    its self-attention is ``causal``, how position enters inside attention
    (``position_in_attention``, None when the embeddings carry it), its ``position_ids``
    rule (:func:`rankcollapse.models.probe.position_ids`; None: no position ids), and
    whether its stack ends in a ``final_norm``."""

    name: str
    model_types: tuple[str, ...]
    causal: bool = False
    position_in_attention: str | None = None
    position_ids: str | None = "count"
    final_norm: bool = False


#: The families, by layout name (Mistral, Qwen2 and Gemma share Llama's module layout).
REGISTRY: dict[str, Family] = {f.name: f for f in (
    Family("bert", ("bert",)),
    Family("roberta", ("roberta", "xlm-roberta", "camembert"), position_ids="padding_idx"),
    Family("albert", ("albert",)),
    Family("gpt2", ("gpt2",), causal=True, final_norm=True),
    Family("t5", ("t5",), position_in_attention="relative position bias", position_ids=None, final_norm=True),
    Family("llama", ("llama", "mistral", "qwen2", "gemma"), causal=True, position_in_attention="RoPE",
           final_norm=True),
)}
GENERIC = Family("generic", ())
#: ``config.model_type`` -> family name.
MODEL_TYPES: dict[str, str] = {mt: f.name for f in REGISTRY.values() for mt in f.model_types}


#: Generic-layout model types whose ``position_ids`` count real tokens from 0 (others keep their own).
COUNT_POSITIONS_GENERIC = frozenset({"distilbert", "gpt_neox", "opt", "phi"})
#: Generic-layout model types that are causal decoders (others are taken as bidirectional).
CAUSAL_GENERIC = frozenset({"gpt_neox", "opt", "phi"})


def position_rule(family_name: str, model_type: str) -> str | None:
    """How ``position_ids`` follow the padding mask for this model; None = the model's own."""
    if family_name == GENERIC.name:
        return "count" if model_type in COUNT_POSITIONS_GENERIC else None
    return family(family_name).position_ids


def native_mask(family_name: str, model_type: str | None) -> str:
    """The mask spec of the model's own self-attention pattern, ``"causal"`` or ``"complete"``."""
    if family_name == GENERIC.name:
        return "causal" if model_type in CAUSAL_GENERIC else "complete"
    return "causal" if family(family_name).causal else "complete"


def native_mask_of(loaded: Any) -> str:
    """:func:`native_mask` of a loaded model."""
    return native_mask(loaded.family, loaded.model.config.model_type)


def family_of(model_type: str) -> str:
    """Family name of a ``config.model_type`` (``"generic"`` if the layout is unknown)."""
    return MODEL_TYPES.get(model_type, GENERIC.name)


def family(name: str) -> Family:
    """The :class:`Family` called ``name``; :class:`ModelError` if unknown."""
    if name == GENERIC.name:
        return GENERIC
    if name not in REGISTRY:
        raise ModelError(f"unknown model family {name!r}; known: {', '.join([*REGISTRY, GENERIC.name])}")
    return REGISTRY[name]


@dataclass(frozen=True)
class Tap:
    """A tensor at a module boundary: its input 0 or its output (element ``index`` of a tuple)."""

    module: nn.Module
    io: str  # "input" | "output"
    index: int = 0


@dataclass(frozen=True)
class Sublayer:
    """A residual unit ``residual + branch`` (``branch`` before the add); ``residual`` None
    for the MLP of a parallel block (GPT-NeoX, Phi), which shares the attention's."""

    branch: Tap
    residual: Tap | None


@dataclass(frozen=True)
class BlockParts:
    block: nn.Module
    self_attn: nn.Module | None = None  # receives the self-attention mask, owns ``scaling``
    mask_arg: str = "attention_mask"
    attn: Sublayer | None = None
    mlp: Sublayer | None = None
    norms: tuple[nn.Module, ...] = ()
    out_proj: nn.Module | None = None  # self-attention output projection; its input is the heads' outputs
    cross_out_proj: nn.Module | None = None  # cross-attention output projection (T5's decoder)


@dataclass(frozen=True)
class Stack:
    prefix: str  # "" or "encoder." / "decoder."
    blocks: tuple[BlockParts, ...]
    final_norm: nn.Module | None
    norm_placement: str  # "post_ln", "pre_ln" or "unknown"

    @property
    def n_layers(self) -> int:
        return len(self.blocks)


def _bert(model: nn.Module) -> list[Stack]:
    blocks = tuple(BlockParts(block=b, self_attn=b.attention.self, out_proj=b.attention.output.dense,
                              attn=Sublayer(Tap(b.attention.output.dense, "output"), Tap(b.attention, "input")),
                              mlp=Sublayer(Tap(b.output.dense, "output"), Tap(b.attention, "output", 0)),
                              norms=(b.attention.output.LayerNorm, b.output.LayerNorm))
                   for b in model.encoder.layer)
    return [Stack("", blocks, None, "post_ln")]


def albert_group(layer: int, n_layers: int, n_groups: int) -> int:
    """The hidden group ALBERT's layer ``layer`` runs: ``int(layer / (n_layers / n_groups))``,
    transformers' rule in ``AlbertTransformer.forward``."""
    return int(layer / (n_layers / n_groups))


def _albert(model: nn.Module) -> list[Stack]:
    enc, cfg = model.encoder, model.config
    calls = []
    for i in range(cfg.num_hidden_layers):
        group = enc.albert_layer_groups[albert_group(i, cfg.num_hidden_layers, cfg.num_hidden_groups)]
        calls.extend(group.albert_layers)
    blocks = tuple(BlockParts(block=a, self_attn=a.attention, out_proj=a.attention.dense,
                              attn=Sublayer(Tap(a.attention.dense, "output"), Tap(a.attention, "input")),
                              mlp=Sublayer(Tap(a.ffn_output, "output"), Tap(a.attention, "output", 0)),
                              norms=(a.attention.LayerNorm, a.full_layer_layer_norm))
                   for a in calls)
    return [Stack("", blocks, None, "post_ln")]


def _pre_ln_block(b: nn.Module, attn: nn.Module, ln_1: nn.Module, ln_2: nn.Module | None, mlp: nn.Module,
                  out_proj: nn.Module, parallel: bool = False) -> BlockParts:
    """``X + SA(ln_1 X)``, then ``+ MLP(ln_2 X)``; ``parallel``: on the attention's residual (ln_2 None: one norm)."""
    return BlockParts(block=b, self_attn=attn, attn=Sublayer(Tap(attn, "output", 0), Tap(ln_1, "input")),
                      mlp=Sublayer(Tap(mlp, "output"), None if parallel else Tap(ln_2, "input")),
                      norms=(ln_1,) if ln_2 is None else (ln_1, ln_2), out_proj=out_proj)


def _gpt2(model: nn.Module) -> list[Stack]:
    blocks = tuple(_pre_ln_block(b, b.attn, b.ln_1, b.ln_2, b.mlp, b.attn.c_proj) for b in model.h)
    return [Stack("", blocks, model.ln_f, "pre_ln")]


def _llama(model: nn.Module) -> list[Stack]:
    blocks = tuple(_pre_ln_block(b, b.self_attn, b.input_layernorm, b.post_attention_layernorm, b.mlp,
                                 b.self_attn.o_proj) for b in model.layers)
    return [Stack("", blocks, model.norm, "pre_ln")]


def _t5_stack(stack: nn.Module, prefix: str) -> Stack:
    blocks = tuple(BlockParts(block=b, self_attn=b.layer[0].SelfAttention, mask_arg="mask",
                              attn=Sublayer(Tap(b.layer[0].SelfAttention, "output", 0), Tap(b.layer[0].layer_norm, "input")),
                              mlp=Sublayer(Tap(b.layer[-1].DenseReluDense, "output"), Tap(b.layer[-1].layer_norm, "input")),
                              norms=tuple(sub.layer_norm for sub in b.layer), out_proj=b.layer[0].SelfAttention.o,
                              cross_out_proj=b.layer[1].EncDecAttention.o if len(b.layer) == 3 else None)
                   for b in stack.block)
    return Stack(prefix, blocks, stack.final_layer_norm, "pre_ln")


def _t5(model: nn.Module) -> list[Stack]:
    stacks = [_t5_stack(model.encoder, "encoder.")]
    if getattr(model, "decoder", None) is not None:
        stacks.append(_t5_stack(model.decoder, "decoder."))
    return stacks


def _generic(model: nn.Module) -> list[Stack]:
    config = model.config
    n_layers = getattr(config, "num_hidden_layers", None)
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == n_layers]
    if not lists:
        raise ModelError(f"cannot find the {n_layers} blocks of {type(model).__name__} (no nn.ModuleList of that "
                         "length); this model is not supported")
    model_type = getattr(config, "model_type", None)
    known = _GENERIC_BLOCKS.get(model_type)
    if known is not None:
        post = model_type == "distilbert" or (model_type == "opt" and not getattr(config, "do_layer_norm_before", True))
        return [Stack("", tuple(known(b, config) for b in lists[0]), None, "post_ln" if post else "pre_ln")]
    return [Stack("", tuple(BlockParts(block=b, self_attn=_find(b, GENERIC_SELF_ATTN), out_proj=_find(b, GENERIC_OUT_PROJ))
                            for b in lists[0]), None, "unknown")]


#: Where blocks of other generic layouts may keep their self-attention module and its output projection.
GENERIC_SELF_ATTN = ("attention", "self_attn")
GENERIC_OUT_PROJ = ("attention.dense", "self_attn.out_proj", "self_attn.dense", "attention.out_lin")


def _find(block: nn.Module, paths: tuple[str, ...]) -> nn.Module | None:
    names = dict(block.named_modules())
    return next((names[p] for p in paths if p in names), None)


def _gpt_neox_block(b: nn.Module, config: object) -> BlockParts:
    return _pre_ln_block(b, b.attention, b.input_layernorm, b.post_attention_layernorm, b.mlp, b.attention.dense,
                         parallel=getattr(config, "use_parallel_residual", True))


def _opt_block(b: nn.Module, config: object) -> BlockParts:
    # OPT runs its MLP on the tokens flattened to (B·N, d); the recorder and editor view them as (B, N, d)
    pre = getattr(config, "do_layer_norm_before", True)
    attn_residual = b.self_attn_layer_norm if pre else b.self_attn
    return BlockParts(block=b, self_attn=b.self_attn, out_proj=b.self_attn.out_proj,
                      attn=Sublayer(Tap(b.self_attn, "output", 0), Tap(attn_residual, "input")),
                      mlp=Sublayer(Tap(b.fc2, "output"), Tap(b.final_layer_norm if pre else b.fc1, "input")),
                      norms=(b.self_attn_layer_norm, b.final_layer_norm))


def _phi_block(b: nn.Module, config: object) -> BlockParts:
    return _pre_ln_block(b, b.self_attn, b.input_layernorm, None, b.mlp, b.self_attn.dense, parallel=True)


def _distilbert_block(b: nn.Module, config: object) -> BlockParts:
    return BlockParts(block=b, self_attn=b.attention, out_proj=b.attention.out_lin,
                      attn=Sublayer(Tap(b.attention, "output", 0), Tap(b.attention, "input")),
                      mlp=Sublayer(Tap(b.ffn, "output"), Tap(b.ffn, "input")), norms=(b.sa_layer_norm, b.output_layer_norm))


#: Generic-layout model types whose blocks the toolkit knows: every intervention works there
#: (no ``final_norm`` point: GPT-NeoX, OPT and Phi's final norm is not recorded).
_GENERIC_BLOCKS = {"gpt_neox": _gpt_neox_block, "opt": _opt_block, "phi": _phi_block, "distilbert": _distilbert_block}


_LAYOUTS = {"bert": _bert, "roberta": _bert, "albert": _albert, "gpt2": _gpt2, "llama": _llama, "t5": _t5, "generic": _generic}
assert set(_LAYOUTS) == {*REGISTRY, GENERIC.name}  # one registry: every family has a layout


def stacks(model: nn.Module, family: str) -> list[Stack]:
    """The stacks of ``model`` laid out as ``family``; :class:`ModelError` for an unknown
    family or a model without that family's modules."""
    if family not in _LAYOUTS:
        raise ModelError(f"unknown model family {family!r}; known: {', '.join(_LAYOUTS)}")
    try:
        return _LAYOUTS[family](model)
    except AttributeError as exc:
        raise ModelError(f"{type(model).__name__} does not have the {family} layout ({exc})") from None


def point_names(stack: Stack, detail: str = "hidden_states") -> list[str]:
    """Names of the points of ``stack`` in forward order: the ``hidden_states`` points
    (``embeddings``, every ``layer.k.output``, ``final_norm``); ``detail="all"`` adds each
    block's input, norms and sublayer outputs."""
    if detail not in ("hidden_states", "all"):
        raise ModelError(f"unknown point detail {detail!r}; use 'hidden_states' or 'all'")
    p = stack.prefix
    names = [point_after(0, p)]
    for k, parts in enumerate(stack.blocks):
        if detail == "all":
            names.append(f"{p}layer.{k}.input")
            names.extend(f"{p}layer.{k}.norm_{j + 1}" for j in range(len(parts.norms)))
            names.extend(f"{p}layer.{k}.{sub}_output" for sub in ("attn", "mlp") if getattr(parts, sub) is not None)
        names.append(block_output(k, p))
    if stack.final_norm is not None:
        names.append(f"{p}final_norm")
    return names


def hidden_states_points(family_name: str, n_layers: int, prefix: str = "") -> list[str | None]:
    """The point name of each of the ``n_layers + 1`` entries of ``output_hidden_states``:
    the last is ``final_norm`` where the family has one, ``layer.{L-1}.output`` where it has
    none, None for the generic family (unknown)."""
    fam = family(family_name)
    last: str | None = (f"{prefix}final_norm" if fam.final_norm else
                        None if fam is GENERIC else block_output(n_layers - 1, prefix))
    return [point_after(t, prefix) for t in range(n_layers)] + [last]


def point_layer(point: str, n_layers: dict[str, int]) -> int:
    """The ``hidden_states`` index of a point of the stacks ``{prefix: blocks}``; ``ValueError``
    or ``KeyError`` for a point of none."""
    prefix = next((p for p in n_layers if p and point.startswith(p)), "")
    return layer_of(point[len(prefix):], n_layers[prefix])


def depth_of(name: str, stack: Stack) -> int:
    """The ``hidden_states`` index a point belongs to (k+1 for every point inside block k)."""
    return layer_of(name[len(stack.prefix):], stack.n_layers)
