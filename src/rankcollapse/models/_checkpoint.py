"""Refuse a model whose loaded weights are not all the checkpoint's own, finite weights.

transformers loads a checkpoint that does not match its ``config.json`` with a warning
only (missing weights randomly initialised, extra tensors dropped).
:func:`check_loaded_weights` turns its loading info into one ``ModelError``. Tolerated,
as they change no number: a missing ``pooler.*`` (no measurement reads it; a note says
so), a task head's tensors, and unused tensors inside a module the model has (GPT-2's
``attn.masked_bias``).
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
    """Refuse a model that transformers loaded with weights the checkpoint did not give
    (``info``: ``from_pretrained(..., output_loading_info=True, ignore_mismatched_sizes=True)``'s
    second value): :class:`ModelError` naming missing weights (other than the pooler), tensors
    of modules the model lacks, wrong shapes or loading errors. Returns notes on what was
    tolerated."""
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
    """:class:`ModelError` naming the tensors that hold NaN or Inf in the loaded dtype (one
    sum per tensor; only a non-finite sum is read again entry by entry)."""
    bad = [name for name, t in model.state_dict().items()
           if t.is_floating_point() and not bool(torch.isfinite(t.sum())) and not bool(torch.isfinite(t).all())]
    if bad:
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        raise ModelError(f"model {source!r}: {_count(bad, 'weight tensor')} hold NaN or Inf as loaded in {dtype} "
                         f"({_few(bad)}); every number computed from them would be NaN or Inf, so the model is "
                         "refused")


def _module_missing(model: Any, key: str) -> bool:
    """Whether an unexpected tensor belongs to a base-model module the model lacks (not a head's, not an attribute)."""
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
