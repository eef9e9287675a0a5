"""Refuse a model whose loaded weights are not all the checkpoint's own, finite weights.

transformers loads a checkpoint that does not match its ``config.json`` with a warning
only: a weight the file lacks is randomly initialised, a tensor the model has no module
for is dropped. The numbers measured on such a model are those of a partly random model,
so :func:`check_loaded_weights` turns what ``from_pretrained(..., output_loading_info=True)``
reports (``missing_keys``, ``unexpected_keys``, ``mismatched_keys``, ``error_msgs``) into
one :class:`~rankcollapse.errors.ModelError` naming the tensors, and
:func:`check_finite_weights` names tensors holding NaN or Inf.

What is tolerated, and why (each keeps the numbers those of the checkpoint):

* Missing ``pooler.*`` (BERT, RoBERTa, ALBERT): a checkpoint saved from a model with a
  task head (``BertForMaskedLM``) has no pooler. The pooler maps the final first token to
  ``pooler_output``, which no measurement reads (the recorder reads the layers' token
  states), so its random initialisation changes no number; a note on the
  :class:`~rankcollapse.models.LoadedModel` says so.
* Unexpected tensors of a task head (``lm_head``, ``cls.predictions``, ``embed_out``...):
  ``AutoModel`` loads the base model, whose modules do not include the head. A tensor is a
  head's when its first name component is not a module of the base model.
* Unexpected tensors inside a module the model has (GPT-2's legacy ``attn.masked_bias``
  buffer): the module's code never reads them, and any weight they would stand for is
  reported missing instead.

Tied weights (GPT-2's ``lm_head`` to ``wte``, T5's ``embed_tokens`` to ``shared``) and the
base-model prefix (``bert.``, ``model.``) are resolved by transformers and never reported.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from ..errors import ModelError

#: Name prefixes of missing weights that are tolerated (see the module docstring).
TOLERATED_MISSING = ("pooler.",)

#: Tensor names an error quotes before giving the count of the rest.
NAMES_SHOWN = 3

POOLER_NOTE = ("the checkpoint has no pooler weights (saved from a model with a task head); the pooler is randomly "
               "initialised and no measurement reads its output")


def check_loaded_weights(model: Any, info: dict[str, list], source: str) -> list[str]:
    """Refuse a model that transformers loaded with weights the checkpoint did not give.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The base model as loaded.
    info : dict
        ``from_pretrained(..., output_loading_info=True)``'s second value, loaded with
        ``ignore_mismatched_sizes=True`` so that wrongly shaped tensors are listed in
        ``mismatched_keys`` as ``(name, checkpoint shape, model shape)`` rather than raised.
    source : str
        The model's name or folder, for the message.

    Returns
    -------
    list of str
        Notes on what was tolerated (a missing pooler), for :attr:`LoadedModel.notes`.

    Raises
    ------
    ModelError
        Missing weights (other than the pooler), tensors of modules the model lacks (a
        checkpoint with more layers than ``config.json``), wrongly shaped tensors, or
        transformers' own loading errors: one line naming a few tensors and the count.
    """
    missing = sorted(info.get("missing_keys") or ())
    refused_missing = [k for k in missing if not k.startswith(TOLERATED_MISSING)]
    foreign = sorted(k for k in info.get("unexpected_keys") or () if _module_missing(model, k))
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: m[0])
    problems = []
    if refused_missing:
        problems.append(f"{_count(refused_missing, 'weight')} missing from the checkpoint ({_few(refused_missing)}) "
                        "would be randomly initialised")
    if foreign:
        problems.append(f"{_count(foreign, 'checkpoint tensor')} belong to modules the model does not have "
                        f"({_few(foreign)}), so config.json describes a smaller model")
    if mismatched:
        shapes = [f"{name} is {_shape(ckpt)} in the checkpoint, {_shape(want)} in the model"
                  for name, ckpt, want in mismatched]
        problems.append(f"{_count(mismatched, 'tensor')} of the wrong shape ({_few(shapes, sep='; ')})")
    errors = [" ".join(str(e).split()) for e in info.get("error_msgs") or ()]
    if errors:
        problems.append(f"transformers reported {_count(errors, 'loading error')} ({_few(errors, sep='; ')[:300]})")
    if problems:
        raise ModelError(f"model {source!r}: the weights do not match config.json: {'; '.join(problems)}; "
                         "the numbers would not be the checkpoint's, so the model is refused")
    return [POOLER_NOTE] if missing else []


def check_finite_weights(model: Any, source: str) -> None:
    """Refuse a model whose parameters or saved buffers hold NaN or Inf.

    Checked in the dtype the model was loaded in (a float32 value beyond float16's range
    becomes Inf when loaded as float16). One reduction per tensor: a sum is finite only
    if every entry is (a NaN or an Inf makes it NaN or Inf), so only a tensor whose sum
    is not finite (an overflowing sum of finite entries, or a non-finite entry) is read
    again entry by entry.

    Raises
    ------
    ModelError
        Names a few tensors holding NaN or Inf and the count, with the dtype.
    """
    bad = [name for name, t in model.state_dict().items()
           if t.is_floating_point() and not bool(torch.isfinite(t.sum())) and not bool(torch.isfinite(t).all())]
    if bad:
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        raise ModelError(f"model {source!r}: {_count(bad, 'weight tensor')} hold NaN or Inf as loaded in {dtype} "
                         f"({_few(bad)}); every number computed from them would be NaN or Inf, so the model is "
                         "refused")


def _module_missing(model: Any, key: str) -> bool:
    """True for an unexpected checkpoint tensor that would live in a module of the base
    model that the model does not have (e.g. ``encoder.layer.6.*`` for a 6-layer config):
    neither a task head's tensor nor an unused attribute of an existing module."""
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    if prefix != "." and key.startswith(prefix):
        key = key[len(prefix):]
    first = key.partition(".")[0]
    if first not in dict(model.named_children()):
        return False  # a task head (lm_head, cls, embed_out...) outside the base model
    try:
        model.get_submodule(key.rpartition(".")[0])
    except AttributeError:
        return True
    return False


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}" + ("s" if len(items) != 1 else "")


def _few(names: Iterable[str], sep: str = ", ") -> str:
    names = list(names)
    shown = sep.join(names[:NAMES_SHOWN])
    rest = len(names) - NAMES_SHOWN
    return shown + (f"{sep}and {rest} more" if rest > 0 else "")


def _shape(shape: Any) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"
