"""Edits of activations inside an unmodified pretrained model (docs/models.md,
"Interventions"): ``fn(tensor, context) -> tensor`` replaces the tensor at a point while
the model runs, so every later point is measured on the edited pass (as baukit's
``nethook.Trace(edit_output=...)``). At ``layer.k.heads`` the edit sees ``(B, N, H, d_head)``.
Head ablation and activation patching are such edits.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn

from .._validate import check_int
from ..errors import ConfigError, ModelError
from . import families
from .loading import LoadedModel
from .recorder import MODULE_PREFIX, _PointHooks, as_tokens, module_tap, resolve_points

ABLATION_MODES = ("zero", "mean")
ABLATION_ATTENTIONS = ("self", "decoder", "cross")
HEADS = "heads"
CROSS_HEADS = "cross_heads"


def is_heads_point(point: str) -> bool:
    """Whether ``point`` holds heads side by side (``layer.k.heads``, ``layer.k.cross_heads``)."""
    return not point.startswith(MODULE_PREFIX) and point.rsplit(".", 1)[-1] in (HEADS, CROSS_HEADS)


@dataclass(frozen=True)
class EditContext:
    """What an edit function is told: the ``point``, the rows of the probed ``windows`` in
    this batch (``range(B)`` outside a probe) and the batch's ``attention_mask`` ``(B, N)``
    (1 = real; T5's ``decoder.`` points see it shifted right), or None."""

    point: str
    windows: range
    attention_mask: torch.Tensor | None


EditFn = Callable[[torch.Tensor, EditContext], torch.Tensor]


@dataclass(frozen=True)
class HeadAblation:
    """Heads to ablate, ``((layer, head), ...)`` (0-based), ``mode`` ``"zero"`` or
    ``"mean"``, in ``attention`` ``"self"`` (T5: the encoder's), ``"decoder"`` (T5's decoder
    self-attention) or ``"cross"`` (T5's cross-attention, at ``decoder.layer.k.cross_heads``).
    :class:`ConfigError` for no heads, a bad pair, a negative index, an unknown mode or attention."""

    heads: tuple[tuple[int, int], ...]
    mode: str = "zero"
    attention: str = "self"

    def __post_init__(self) -> None:
        try:
            heads = tuple((check_int(k, "layer"), check_int(h, "head")) for k, h in self.heads)
        except (TypeError, ValueError, ConfigError):
            raise ConfigError(f"ablate_heads: give (layer, head) pairs of integers, e.g. ((3, 1), (3, 5)); got "
                              f"{self.heads!r}") from None
        if not heads:
            raise ConfigError("ablate_heads: give at least one (layer, head)")
        if any(k < 0 or h < 0 for k, h in heads):
            raise ConfigError(f"ablate_heads: layers and heads are 0-based, got {list(heads)}")
        if len(set(heads)) != len(heads):
            raise ConfigError(f"ablate_heads: a (layer, head) is given twice in {list(heads)}")
        if self.mode not in ABLATION_MODES:
            raise ConfigError(f"unknown ablation {self.mode!r}; choose from {', '.join(ABLATION_MODES)}")
        if self.attention not in ABLATION_ATTENTIONS:
            raise ConfigError(f"unknown attention {self.attention!r} to ablate; choose from "
                              f"{', '.join(ABLATION_ATTENTIONS)}")
        object.__setattr__(self, "heads", heads)

    def point(self, layer: int, prefix: str = "") -> str:
        """``{prefix}layer.{layer}.heads`` (``.cross_heads`` for ``attention="cross"``)."""
        return f"{prefix}layer.{layer}.{CROSS_HEADS if self.attention == 'cross' else HEADS}"

    def by_layer(self) -> dict[int, list[int]]:
        """``{layer: sorted heads}``."""
        out: dict[int, set[int]] = defaultdict(set)
        for k, h in self.heads:
            out[k].add(h)
        return {k: sorted(v) for k, v in sorted(out.items())}


def parse_heads(text: str) -> tuple[tuple[int, int], ...]:
    """``"3.1,3.5"`` -> ``((3, 1), (3, 5))``; :class:`ConfigError` for an item that is not
    ``LAYER.HEAD``."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        layer, dot, head = item.partition(".")
        if not (dot and layer.isdigit() and head.isdigit()):
            raise ConfigError(f"bad head {item!r} in {text!r}; write LAYER.HEAD items, e.g. 3.1,3.5")
        out.append((int(layer), int(head)))
    if not out:
        raise ConfigError(f"no heads in {text!r}; write LAYER.HEAD items, e.g. 3.1,3.5")
    return tuple(out)


#: the config fields that name the number of attention heads, by family
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")


def n_heads(model: nn.Module) -> int:
    """The number of attention heads in ``model.config``; :class:`ModelError` if it names none."""
    config = model.config
    for key in HEAD_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    raise ModelError(f"{type(model).__name__}'s config names no number of attention heads")


def split_heads(X: torch.Tensor, H: int, point: str) -> torch.Tensor:
    if X.ndim != 3 or X.shape[-1] % H:
        raise ModelError(f"{point}: the output projection's input {tuple(X.shape)} is not (B, N, H·d_head) "
                         f"for H = {H}")
    return X.unflatten(-1, (H, X.shape[-1] // H))  # (B, N, H, d_head)


def _pick(value: Any, index: int, point: str) -> torch.Tensor:
    if isinstance(value, tuple):
        value = value[index]
    if not isinstance(value, torch.Tensor):
        raise ModelError(f"{point}: the module's output is a {type(value).__name__}, not a tensor to edit")
    return value


def _replace(value: Any, index: int, new: torch.Tensor) -> Any:
    return value[:index] + (new,) + value[index + 1:] if isinstance(value, tuple) else new


class Editor(_PointHooks):
    """Context manager installing edits ``{point: fn}`` on ``loaded.model``, each told
    ``attention_mask`` and ``windows`` in its :class:`EditContext`. :class:`ModelError` for an
    unknown point or one that is not a tensor; :class:`ConfigError` for an edit that does not
    return a tensor of the shape it was given (the result is cast to its dtype)."""

    def __init__(self, loaded: LoadedModel, edits: Mapping[str, EditFn], *,
                 attention_mask: torch.Tensor | None = None, windows: range | None = None):
        model = loaded.model
        table = resolve_points(families.stacks(model, loaded.family))
        self.heads = n_heads(model) if any(is_heads_point(p) for p in edits) else 0
        taps = []
        for point, fn in edits.items():
            if not callable(fn):
                raise ConfigError(f"edit at {point!r}: {fn!r} is not a function fn(tensor, context) -> tensor")
            if point.startswith(MODULE_PREFIX):
                tap, occ = module_tap(model, point), 0
            elif point in table:
                tap, occ = table[point]
            else:
                raise ModelError(f"no point {point!r} to edit in family {loaded.family!r}; use a point name "
                                 f"(e.g. {list(table)[:4]}) or module:PATH")
            taps.append((point, tap, occ, fn))
        super().__init__(model, taps)
        self.windows = windows
        self.attention_mask = attention_mask

    def _visit(self, key: tuple[int, str], value: Any) -> Any:
        for point, index, fn in self._entries(key):
            X = _pick(value, index, point)
            heads = is_heads_point(point)
            tokens = X if point.startswith(MODULE_PREFIX) else as_tokens(X, self._tokens)
            given = split_heads(tokens, self.heads, point) if heads else tokens
            windows = self.windows if self.windows is not None else range(X.shape[0])
            new = fn(given, EditContext(point, windows, self.attention_mask))
            if not isinstance(new, torch.Tensor) or new.shape != given.shape:
                got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
                raise ConfigError(f"the edit at {point!r} returned {got}; return a tensor of the shape it "
                                  f"was given, {tuple(given.shape)}")
            new = new.to(dtype=X.dtype, device=X.device)
            value = _replace(value, index, (new.flatten(-2) if heads else new).reshape(X.shape))
        return value


def check_ablation(loaded: LoadedModel, ablation: HeadAblation) -> str:
    """Refuse heads the model does not have; returns the prefix of the stack ``ablation``
    names (``""``; T5: ``"encoder."`` or ``"decoder."``). :class:`ConfigError` for a layer or
    head out of range, or ``"decoder"``/``"cross"`` without T5's decoder; :class:`ModelError`
    without a known output projection."""
    stack_list = families.stacks(loaded.model, loaded.family)
    if ablation.attention == "self":
        stack = stack_list[0]
    else:
        stack = next((s for s in stack_list if s.prefix == "decoder."), None)
        if stack is None:
            raise ConfigError(f"attention {ablation.attention!r} names T5's decoder; {type(loaded.model).__name__} "
                              "has none: ablate its self-attention (attention='self')", argument="ablate_heads")
    projections = [p.cross_out_proj if ablation.attention == "cross" else p.out_proj for p in stack.blocks]
    if any(m is None for m in projections):
        raise ModelError(f"{type(loaded.model).__name__} ({loaded.family} layout) has no self-attention output "
                         "projection the toolkit knows; head ablation hooks its input")
    L, H = stack.n_layers, n_heads(loaded.model)
    bad = [(k, h) for k, h in ablation.heads if k >= L or h >= H]
    if bad:
        raise ConfigError(f"{bad}: the model has layers 0..{L - 1} and heads 0..{H - 1}", argument="ablate_heads")
    return stack.prefix


def edit_settings(edits: Mapping[str, EditFn] | None, ablation: HeadAblation | None) -> dict[str, Any]:
    """How a table or states sidecar records its edits: ``edits`` (the points) and
    ``ablate_heads`` (``{"heads": [[layer, head], ...], "mode": ...}``), each when given."""
    out: dict[str, Any] = {"edits": list(edits)} if edits else {}
    if ablation is not None:
        where = {} if ablation.attention == "self" else {"attention": ablation.attention}
        out["ablate_heads"] = {"heads": [list(kh) for kh in ablation.heads], "mode": ablation.mode, **where}
    return out


def ablation_edits(ablation: HeadAblation, means: Mapping[str, torch.Tensor] | None = None,
                   prefix: str = "") -> dict[str, EditFn]:
    """The edits that implement ``ablation``, one per layer at ``{prefix}layer.k.heads``;
    ``means`` (``mode="mean"``): point -> :func:`head_means`. :class:`ConfigError` for a
    missing mean."""
    edits: dict[str, EditFn] = {}
    for k, heads in ablation.by_layer().items():
        point = ablation.point(k, prefix)
        if ablation.mode == "mean" and (means is None or point not in means):
            raise ConfigError(f"mean ablation of {point} needs its mean head outputs (head_means)")
        mean = means[point] if ablation.mode == "mean" else None

        def fn(Z: torch.Tensor, ctx: EditContext, heads: list[int] = heads, mean: Any = mean) -> torch.Tensor:
            Z = Z.clone()
            Z[:, :, heads] = 0 if mean is None else mean[None, : Z.shape[1], heads].to(Z)
            return Z

        edits[point] = fn
    return edits


def head_means(heads: torch.Tensor, attention_mask: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The heads' output ``(N, H, d_head)`` at each position, float64, averaged over the
    windows whose token there is real (0 where none is), of ``heads`` ``(B, N, H·d_head)``."""
    Z = split_heads(heads.double(), n_heads, "heads")  # (B, N, H, d_head)
    real = attention_mask.to(torch.float64)[:, :, None, None]  # (B, N, 1, 1)
    return (Z * real).sum(dim=0) / real.sum(dim=0).clamp(min=1)
