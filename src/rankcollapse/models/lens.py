"""Models as interpretability libraries wrap them: a TransformerLens ``TransformerBridge``
and an nnsight model, recorded with the library's own mechanism.

:func:`~rankcollapse.models.probe` accepts these objects beside a transformers model
and records the same ``hidden_states`` points (``embeddings``, every ``layer.k.output``,
``final_norm``), so the three give the same table when they run the same weights.

TransformerLens 4 (whose ``TransformerBridge`` replaced ``HookedTransformer``): the
points are read from ``run_with_cache`` with ``names_filter`` set to their hooks,
:data:`LENS_HOOKS`:

- ``embeddings``: ``blocks.0.hook_resid_pre`` (``hook_embed + hook_pos_embed`` where
  positions are added to the embeddings);
- ``layer.k.output``: ``blocks.k.hook_resid_post``;
- ``final_norm``: ``ln_final.hook_out``, the norm's output after its scale and bias (the
  bridge's ``ln_final.hook_normalized`` is taken before them).

The residual stream is the one TransformerLens computes. A bridge on which
``enable_compatibility_mode()`` or ``process_weights()`` ran has processed weights, as
``HookedTransformer`` had by default: ``center_writing_weights`` removes every token's
mean over ``d`` from what each component writes into the residual stream, and
``fold_ln`` moves the final norm's scale and bias into the unembedding, so cosines, μ
and ranks are those of the processed model, not of the transformers model; the
table's notes say so.

nnsight (``NNsight(model)``, ``TransformersModel(model, tokenizer=...)``, any ``Envoy``
around a transformers model): the points are the module inputs and outputs that
:class:`~rankcollapse.models.Recorder` reads (block 0's input, each block's output,
the final norm's output), saved with ``.save()`` inside ``model.trace(...)`` on the
envoys of those modules; the model runs on the inputs
:func:`~rankcollapse.models.probe.model_inputs` builds for the transformers model.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import ModelError
from ..points import layer_of
from . import families
from .loading import LoadedModel, as_loaded
from .recorder import _pick, resolve_points

#: TransformerLens hook of each point (``k``: the block).
LENS_HOOKS = {"embeddings": "blocks.0.hook_resid_pre", "layer.{k}.output": "blocks.{k}.hook_resid_post",
              "final_norm": "ln_final.hook_out"}


@dataclass
class LibraryModel:
    """A model object of an interpretability library, ready to record the ``hidden_states`` points.

    Attributes
    ----------
    library : ``"transformer_lens"`` or ``"nnsight"``.
    loaded : the transformers model the library runs (name, family, config; its
        ``notes`` say how the points were recorded).
    points : point name -> ``layer`` (``hidden_states`` index), in forward order.
    record : model inputs of one batch (:func:`~rankcollapse.models.probe.model_inputs`)
        -> point name -> tokens ``(B, N, d)``, from one forward pass.
    """

    library: str
    loaded: LoadedModel
    points: dict[str, int]
    record: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] = field(repr=False)


def library_model(model: Any) -> LibraryModel | None:
    """The :class:`LibraryModel` of a TransformerLens bridge or an nnsight model; None
    for anything else (a transformers model, a :class:`LoadedModel`). Neither library
    is imported here: a model of one means it is loaded already.

    Raises
    ------
    ModelError
        A TransformerLens model that is not a ``TransformerBridge`` around a
        transformers model with one stack of blocks; an nnsight model around something
        other than a transformers model, or one whose blocks share a module.
    """
    if type(model).__module__.split(".")[0] == "transformer_lens":
        return _lens_model(model)
    nnsight = sys.modules.get("nnsight")
    if nnsight is not None and isinstance(model, nnsight.Envoy):
        return _nnsight_model(model)
    return None


def open_model(model: Any) -> tuple[LoadedModel, LibraryModel | None]:
    """``model`` as the :class:`LoadedModel` the toolkit runs, with its :class:`LibraryModel`
    when it is a TransformerLens or nnsight model (else None): what a public entry point
    does once with the model it is given.

    Raises
    ------
    ModelError
        As :func:`library_model` and :func:`~rankcollapse.models.as_loaded`.
    """
    library = library_model(model)
    return (library.loaded, library) if library is not None else (as_loaded(model), None)


def _lens_model(bridge: Any) -> LibraryModel:
    hf = getattr(bridge, "original_model", None)
    hooks = getattr(bridge, "hook_dict", {})
    if hf is None or "blocks.0.hook_resid_pre" not in hooks:
        raise ModelError(f"a TransformerLens {type(bridge).__name__} is probed as a TransformerBridge (TransformerLens "
                         "4) around a transformers model, with the hooks blocks.k.hook_resid_*")
    loaded = as_loaded(hf)
    if getattr(hf.config, "is_encoder_decoder", False):
        raise ModelError(f"{type(hf).__name__} is an encoder-decoder: probe it as a transformers model, not through "
                         "TransformerLens")
    n_layers = int(bridge.cfg.n_layers)
    names = {"embeddings": LENS_HOOKS["embeddings"]}
    names.update({f"layer.{k}.output": LENS_HOOKS["layer.{k}.output"].format(k=k) for k in range(n_layers)})
    if LENS_HOOKS["final_norm"] in hooks:
        names["final_norm"] = LENS_HOOKS["final_norm"]
    missing = [h for h in names.values() if h not in hooks]
    if missing:
        raise ModelError(f"TransformerLens {type(bridge).__name__} has no hook {missing[0]!r}")
    loaded.notes = [
        "recorded by TransformerLens run_with_cache: embeddings = blocks.0.hook_resid_pre, layer.k.output = "
        "blocks.k.hook_resid_post" + (", final_norm = ln_final.hook_out" if "final_norm" in names else "")]
    # process_weights() (which enable_compatibility_mode() runs) sets this flag; TransformerLens has no public one.
    if getattr(bridge, "_weights_processed", False):
        loaded.notes.append(
            "TransformerLens processed the weights (enable_compatibility_mode/process_weights; by default fold_ln and "
            "center_writing_weights): the residual stream is the processed model's, every token centred over d and "
            "the final norm without its scale and bias, so cosines, mu and ranks differ from the transformers model's")

    def record(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        _, cache = bridge.run_with_cache(inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                         names_filter=list(names.values()), return_type=None)
        return {point: cache[hook] for point, hook in names.items()}

    points = {p: layer_of(p, n_layers) for p in names}
    return LibraryModel("transformer_lens", loaded, points, record)


def _nnsight_model(envoy: Any) -> LibraryModel:
    import nnsight

    module = envoy._module  # the wrapped torch module (an attribute nnsight's Envoy documents)
    loaded = as_loaded(module)
    stacks = families.stacks(loaded.model, loaded.family)
    table = resolve_points(stacks)
    paths = {id(m): path for path, m in module.named_modules()}
    taps: dict[str, tuple[Any, str, int]] = {}
    points: dict[str, int] = {}
    for stack in stacks:
        for name in families.point_names(stack):
            tap, occurrence = table[name]
            if occurrence:
                raise ModelError(f"{type(module).__name__} runs one module as several blocks ({name}): probe it as a "
                                 "transformers model, not through nnsight")
            path = paths[id(tap.module)]
            taps[name] = (envoy.get(path) if path else envoy, tap.io, tap.index)
            points[name] = families.depth_of(name, stack)
    loaded.notes = ["recorded by nnsight model.trace(): .save() of block 0's input, each block's output and the "
                    "final norm's output where there is one"]

    def record(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with envoy.trace(**inputs):
            saved = {}
            for name, (node, io, _) in taps.items():
                saved[name] = (node.input if io == "input" else node.output).save()
            nnsight.save(saved)
        return {name: _pick(saved[name], taps[name][2]) for name in taps}

    return LibraryModel("nnsight", loaded, points, record)
