"""Models as interpretability libraries wrap them, a TransformerLens ``TransformerBridge``
(``run_with_cache`` at :data:`LENS_HOOKS`) and an nnsight model (``.save()`` inside
``model.trace(...)``), recorded at the same ``hidden_states`` points as a transformers
model (docs/models.md, "TransformerLens and nnsight models").
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
    """A model of an interpretability library: ``library`` (``"transformer_lens"`` or
    ``"nnsight"``), the transformers model it runs (``loaded``), ``points`` (name ->
    ``layer``) and ``record`` (model inputs -> point name -> tokens ``(B, N, d)``)."""

    library: str
    loaded: LoadedModel
    points: dict[str, int]
    record: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] = field(repr=False)


def library_model(model: Any) -> LibraryModel | None:
    """The :class:`LibraryModel` of a TransformerLens bridge or an nnsight model, None for
    anything else (neither library is imported here); :class:`ModelError` for a TransformerLens
    model that is no one-stack ``TransformerBridge``, or an nnsight model around no
    transformers model or whose blocks share a module."""
    if type(model).__module__.split(".")[0] == "transformer_lens":
        return _lens_model(model)
    nnsight = sys.modules.get("nnsight")
    if nnsight is not None and isinstance(model, nnsight.Envoy):
        return _nnsight_model(model)
    return None


def open_model(model: Any) -> tuple[LoadedModel, LibraryModel | None]:
    """``(LoadedModel, LibraryModel or None)`` of ``model``; errors as :func:`library_model`
    and :func:`~rankcollapse.models.as_loaded`."""
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
