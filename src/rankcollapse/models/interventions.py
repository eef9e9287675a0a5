"""Interventions inside an unmodified pretrained model, undone on exit: forward hooks,
plus ``scaling`` swapped and restored (docs/models.md, "Interventions").

The attention temperature as ``d_qk``: a model scores ``q·k · scaling``; in the paper's notation
(Sec. 3, Eq. (1)) scores are ``q·k / sqrt(d_qk)``, so its own ``d_qk = 1 / scaling²``, and another
``d_qk = D`` is the intervention ``d_qk_scale = D · scaling²``.
"""

from __future__ import annotations

import inspect
import math
import re
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import nn

from ..errors import ConfigError, ModelError
from ..masks import dense_mask
from ..masks.schedule import MaskSchedule, schedule_or_mask
from ..masks.rows import check_rows_allow_key
from . import families
from .edits import Editor, _replace
from .families import Stack, Tap
from .loading import as_loaded
from .recorder import _pick, register_hook

COMPONENTS = ("skip", "mlp", "norm", "final_norm")


def model_d_qk(loaded: Any) -> float:
    """The model's own ``d_qk = 1 / scaling²``; :class:`ModelError` for unknown
    self-attention modules, a non-numeric ``scaling``, or modules that disagree."""
    loaded = as_loaded(loaded)
    scalings = set()
    for stack in families.stacks(loaded.model, loaded.family):
        for block in stack.blocks:
            if block.self_attn is None:
                raise ModelError(f"d_qk= is not supported for {type(loaded.model).__name__} ({loaded.family} layout): "
                                 "no self-attention module the toolkit knows")
            s = getattr(block.self_attn, "scaling", None)
            if not isinstance(s, (int, float)) or not s > 0:
                raise ModelError(f"{type(block.self_attn).__name__} has no numeric 'scaling'; cannot set d_qk")
            scalings.add(float(s))
    if len(scalings) != 1:
        raise ModelError(f"the model's attention modules use different scalings {sorted(scalings)}; "
                         "give d_qk_scale instead of d_qk")
    return 1.0 / scalings.pop() ** 2


def check_d_qk(d_qk: Any, name: str = "d_qk") -> float:
    """``d_qk`` (or another temperature, ``name``) as a float; :class:`ConfigError` (argument
    ``name``) unless positive and finite."""
    if isinstance(d_qk, bool) or not isinstance(d_qk, (int, float)) or not (math.isfinite(d_qk) and d_qk > 0):
        raise ConfigError(f"must be a positive finite number, got {d_qk!r}", argument=name)
    return float(d_qk)


def d_qk_scale_for(loaded: Any, d_qk: float | None, d_qk_scale: float = 1.0) -> float:
    """The ``d_qk_scale`` that gives attention temperature ``d_qk`` (None: ``d_qk_scale``);
    :class:`ConfigError` for a bad ``d_qk`` or both given, :class:`ModelError` as :func:`model_d_qk`."""
    if d_qk is None:
        return d_qk_scale
    check_d_qk(d_qk)
    if d_qk_scale != 1.0:
        raise ConfigError("give d_qk or d_qk_scale, not both (d_qk_scale = d_qk / the model's own d_qk)")
    return float(d_qk) / model_d_qk(loaded)


#: One entry of a drop block list: a block ``k`` or a range ``low-high``.
_BLOCKS = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?")


def parse_drop(drop: Sequence[str] | str, n_layers: int | None) -> dict[str, set[int]]:
    """``["mlp", "skip:0-2,5"]`` -> ``{"mlp": {0..L-1}, "skip": {0, 1, 2, 5}}`` (``n_layers=None``:
    checked without a model); :class:`ConfigError` for an unknown component, a block out of
    range, a reversed range, a block list on ``final_norm``, or a component (or one of its blocks)
    given twice (``"skip,skip"``, ``"skip:0-2,skip:2"``)."""
    if isinstance(drop, str):
        text, drop = drop, split_drop(drop)
        if not drop and text.strip():  # "," would otherwise drop nothing, silently
            raise ConfigError(f"drop {text!r} names no component; choose from {', '.join(COMPONENTS)}")
    out: dict[str, set[int]] = {}
    given: dict[str, set[int] | None] = {}  # the blocks named so far per component (None: every block)
    for item in drop:
        name, colon, spec = item.strip().partition(":")
        if name not in COMPONENTS:
            raise ConfigError(f"unknown component to drop {name!r}; choose from {', '.join(COMPONENTS)}")
        layers: set[int] = set()
        for part in filter(None, (p.strip() for p in spec.split(","))) if spec else []:
            blocks = _BLOCKS.fullmatch(part)  # "0-" would otherwise read as block 0
            if blocks is None:
                raise ConfigError(f"bad block list {spec!r} in {item!r}; use e.g. 'skip:0-3,7'")
            first, last = int(blocks[1]), int(blocks[2] or blocks[1])
            if last < first:  # an empty range would otherwise widen to every block
                raise ConfigError(f"empty block range {part!r} in {item!r}; write it low-high, e.g. 'skip:1-3'")
            _refuse_twice(name, layers & set(range(first, last + 1)), drop)
            layers.update(range(first, last + 1))
        if colon and not layers:  # an empty list would otherwise widen to every block
            raise ConfigError(f"{item!r} names no block after ':'; write {name!r} for every block or e.g. "
                              f"'{name}:0-3,7'")
        if name == "final_norm" and layers:
            raise ConfigError(f"{item!r}: the final norm is not per block; write 'final_norm' alone")
        bad = sorted(k for k in layers if n_layers is not None and not 0 <= k < n_layers)
        if bad:
            raise ConfigError(f"drop {item!r}: block(s) {bad} outside 0..{n_layers - 1}")
        if name in given:
            before = given[name]
            _refuse_twice(name, None if before is None or not layers else before & layers, drop)
        given[name] = set(layers) if layers else None
        out.setdefault(name, set()).update(layers or range(n_layers or 0))
    return out


def _refuse_twice(name: str, again: set[int] | None, drop: Sequence[str]) -> None:
    """:class:`ConfigError` when ``again`` (blocks of component ``name`` named before; None:
    every block) is not empty, naming the entry and the ``drop`` list."""
    if again is None or again:
        what = repr(name) if again is None else f"block {min(again)} of {name!r}"
        raise ConfigError(f"drop: {what} is given twice in {list(drop)}")


def split_drop(text: str) -> list[str]:
    """``"skip:0-3,7,mlp"`` -> ``["skip:0-3,7", "mlp"]`` (a digit continues the block list)."""
    items: list[str] = []
    for tok in (t.strip() for t in text.split(",")):
        if tok and tok[0].isdigit() and items:
            items[-1] += "," + tok
        elif tok:
            items.append(tok)
    return items


def additive_mask(allowed: torch.Tensor, padding: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(B, 1, N, N)`` additive mask: 0 where ``allowed[i, j]`` and key j is real,
    ``finfo(dtype).min`` elsewhere (finite: a fully masked row stays NaN-free)."""
    ok = allowed.to(padding.device)[None, None] & padding.bool()[:, None, None, :]
    out = torch.zeros(ok.shape, dtype=dtype, device=padding.device)
    return out.masked_fill_(~ok, torch.finfo(dtype).min)


def check_real_rows(allowed: torch.Tensor, padding: torch.Tensor, spec: str | None = None) -> None:
    """:class:`MaskError` naming the real query rows of ``allowed`` ``(N, N)`` left with no
    real key (``padding`` ``(B, N)``, 1 = real; padding rows are not checked)."""
    real = padding.bool()
    ok = allowed.to(real.device)[None] & real[:, None, :]
    label = f"{spec if spec is not None else 'mask'} on the real tokens (padding keys removed)"
    check_rows_allow_key(ok | ~real[:, :, None], label)


def _mask_hook(module: nn.Module, arg: str, value: torch.Tensor):
    params = [p for p in inspect.signature(module.forward).parameters.values() if p.kind != p.VAR_KEYWORD]
    pos = next((i for i, p in enumerate(params) if p.name == arg), None)
    if pos is None:
        raise ModelError(f"{type(module).__name__}.forward has no argument {arg!r}; cannot replace its mask")

    def hook(mod: nn.Module, args: tuple, kwargs: dict):
        if len(args) > pos:
            args = args[:pos] + (value,) + args[pos + 1 :]
        else:
            kwargs = dict(kwargs, **{arg: value})
        return args, kwargs

    return hook


class _BlockTracker:
    """Which block (position in the stack) is running, also when one module serves several (ALBERT)."""

    def __init__(self, stack: Stack) -> None:
        self.positions: dict[int, list[int]] = {}
        self.modules: dict[int, nn.Module] = {}
        for k, parts in enumerate(stack.blocks):
            self.positions.setdefault(id(parts.block), []).append(k)
            self.modules[id(parts.block)] = parts.block
        self.calls: dict[int, int] = {}
        self.current: int | None = None

    def reset(self, *_: Any, **__: Any) -> None:
        self.calls.clear()
        self.current = None

    def enter_block(self, module: nn.Module, args: tuple, kwargs: dict | None = None) -> None:
        j = self.calls.get(id(module), 0)
        self.calls[id(module)] = j + 1
        positions = self.positions[id(module)]
        self.current = positions[j % len(positions)]


def _distinct(modules: Sequence[nn.Module | None]) -> list[nn.Module]:
    seen: dict[int, nn.Module] = {}
    for m in modules:
        if m is not None:
            seen.setdefault(id(m), m)
    return list(seen.values())


def _drop_hooks(stack: Stack, chosen: dict[str, set[int]], tracker: _BlockTracker) -> list[tuple[nn.Module, str, Any]]:
    """``(module, "input"|"output", hook)`` triples implementing ``chosen`` on one stack."""
    hooks: list[tuple[nn.Module, str, Any]] = []
    saved: dict[str, torch.Tensor] = {}
    for sub_name in ("attn", "mlp"):
        zero_blocks = chosen.get("mlp", set()) if sub_name == "mlp" else set()
        skip_blocks = chosen.get("skip", set()) - zero_blocks
        if not (skip_blocks or zero_blocks):
            continue
        subs = [getattr(p, sub_name) for p in stack.blocks]
        if any(s is None for s in subs):
            raise ModelError(f"this model family exposes no {sub_name} sublayer; cannot drop {sorted(chosen)}")
        if subs[0].residual is None:  # a parallel block's MLP: the residual is removed once, from the attention
            skip_blocks = set()
        if skip_blocks:
            res = subs[0].residual
            for m in _distinct([s.residual.module for s in subs]):
                hooks.append((m, res.io, _save(tracker, skip_blocks, saved, sub_name, res)))
        for m in _distinct([s.branch.module for s in subs]):
            hooks.append((m, "output", _rewrite_branch(tracker, skip_blocks, zero_blocks, saved, sub_name,
                                                      subs[0].branch.index)))
    if "norm" in chosen:
        norms = _distinct([n for p in stack.blocks for n in p.norms])
        hooks.extend((m, "output", _identity(tracker, chosen["norm"])) for m in norms)
    if "final_norm" in chosen and stack.final_norm is not None:
        hooks.append((stack.final_norm, "output", lambda m, a, o: a[0]))
    return hooks


def _save(tracker: _BlockTracker, blocks: set[int], saved: dict, key: str, tap: Tap):
    def pre(module, args, kwargs):
        if tracker.current in blocks:
            saved[key] = args[0] if args else kwargs["hidden_states"]

    def post(module, args, output):
        if tracker.current in blocks:
            saved[key] = _pick(output, tap.index)

    return pre if tap.io == "input" else post


def _rewrite_branch(tracker: _BlockTracker, skip_blocks: set[int], zero_blocks: set[int], saved: dict, key: str, index: int):
    def post(module, args, output):
        k = tracker.current
        if k in zero_blocks:
            return _replace(output, index, torch.zeros_like(_pick(output, index)))
        if k in skip_blocks:
            return _replace(output, index, _pick(output, index) - saved.pop(key))
        return None

    return post


def _identity(tracker: _BlockTracker, blocks: set[int]):
    def post(module, args, output):
        return args[0] if tracker.current in blocks else None

    return post


def _supported(loaded: Any, attention: bool, drop: bool) -> list[Stack]:
    """The stacks of ``loaded``; ModelError when the layout lacks what ``drop`` or ``attention`` needs."""
    stack_list = families.stacks(loaded.model, loaded.family)
    name = f"the generic family ({type(loaded.model).__name__})"
    if drop and any(p.attn is None or p.mlp is None for s in stack_list for p in s.blocks):
        raise ModelError(f"drop is not supported for {name}: it needs the sublayers and norms of a known layout; "
                         f"supported families: {', '.join(families.REGISTRY)}, and GPT-NeoX, OPT, Phi, DistilBERT")
    if attention and any(p.self_attn is None for s in stack_list for p in s.blocks):
        raise ModelError(f"a replacement mask or d_qk is not supported for {name}: no self-attention module it knows; "
                         f"supported families: {', '.join(families.REGISTRY)}, and GPT-NeoX, OPT, Phi, DistilBERT")
    return stack_list


@contextmanager
def intervene(loaded: Any, *, mask: Any = None, d_qk_scale: float = 1.0, drop: Sequence[str] | str = (),
              attention_mask: torch.Tensor | None = None, clip_massive: bool = False,
              edits: Mapping[str, Any] | None = None, windows: range | None = None) -> Iterator[list[Any]]:
    """Apply interventions (docs/models.md, "Interventions") to ``loaded.model`` inside the block; the block
    gets the :class:`~rankcollapse.models.massive.MassiveClip` of each stack (empty without
    ``clip_massive``).

    Parameters
    ----------
    loaded : LoadedModel
    mask : replacement self-attention mask: ``Mask``, spec string or bool ``(N, N)``
        tensor (``M[i, j]``: token i attends to token j), or a schedule
        (``"schedule:..."``: block ``k`` gets mask ``k mod period``).
    d_qk_scale : s > 0; attention logits are divided by sqrt(s).
    drop : components to remove (:func:`parse_drop`).
    attention_mask : ``(B, N)`` padding mask (1 = real) of the batch about to run;
        required with ``mask`` and ``clip_massive``.
    clip_massive : clip each window's massive token (runs after the other interventions).
    edits : point name (or ``module:PATH``) -> ``fn(tensor, context) -> tensor``
        (:class:`~rankcollapse.models.edits.Editor`; after ``drop``, before the clip).
    windows : the rows of the probed windows this batch holds; default ``range(B)``.

    Raises
    ------
    ConfigError
        ``d_qk_scale`` not a positive finite number, unknown component, ``mask`` without
        ``attention_mask``.
    MaskError
        Mask size differs from the window length, or a real token keeps no real key.
    ModelError
        The family does not support the intervention.

    See Also
    --------
    probe : runs its forward passes inside this context (``mask``, ``d_qk``, ``drop``).
    rankcollapse.models.interventions.parse_drop : the components ``drop`` names.
    rankcollapse.masks.parse_mask : the mask specs accepted.

    Examples
    --------
    >>> import torch, transformers
    >>> _ = torch.manual_seed(0)
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0)
    >>> model = transformers.GPT2Model(config).eval()  # a tiny randomly initialised GPT-2
    >>> ids = torch.tensor([[1, 2, 3, 4]])
    >>> with intervene(model, drop="mlp"):  # every block's MLP removed inside the block
    ...     without_mlp = model(ids).last_hidden_state
    >>> torch.equal(without_mlp, model(ids).last_hidden_state)  # restored on exit
    False
    >>> with intervene(model, mask="causal", attention_mask=torch.ones_like(ids)):  # GPT-2's own mask
    ...     same = model(ids).last_hidden_state
    >>> torch.allclose(same, model(ids).last_hidden_state, atol=1e-6)
    True
    >>> with intervene(model, mask="complete", attention_mask=torch.ones_like(ids)):
    ...     bidirectional = model(ids).last_hidden_state  # token 0 now attends to the others
    >>> torch.allclose(bidirectional[:, 0], model(ids).last_hidden_state[:, 0], atol=1e-6)
    False
    """
    check_d_qk(d_qk_scale, "d_qk_scale")
    loaded = as_loaded(loaded)
    drop_list = split_drop(drop) if isinstance(drop, str) else list(drop)
    attention = mask is not None or d_qk_scale != 1.0
    stack_list = _supported(loaded, attention, bool(drop_list)) if attention or drop_list or clip_massive else []
    if attention_mask is not None:
        mask = schedule_or_mask(mask, attention_mask.shape[1])
    handles: list[Any] = []
    restore: list[tuple[nn.Module, float]] = []
    editor = Editor(loaded, edits, attention_mask=attention_mask, windows=windows) if edits else None
    try:
        for stack in stack_list:
            attn_modules = _distinct([p.self_attn for p in stack.blocks])
            if mask is not None:
                handles.extend(_install_mask(loaded, stack, attn_modules, mask, attention_mask))
            if d_qk_scale != 1.0:
                for m in attn_modules:
                    if not isinstance(getattr(m, "scaling", None), (int, float)):
                        raise ModelError(f"{type(m).__name__} has no numeric 'scaling'; cannot change d_qk")
                    restore.append((m, m.scaling))
                    m.scaling = m.scaling / math.sqrt(d_qk_scale)
            if drop_list:
                handles.extend(_install_drops(loaded, stack, drop_list))
        if editor is not None:
            editor.__enter__()
        clips = [_install_clip(loaded, stack, attention_mask, handles) for stack in stack_list] if clip_massive else []
        yield clips
    finally:
        if editor is not None:
            editor.__exit__(None, None, None)
        for h in handles:
            h.remove()
        for m, value in restore:
            m.scaling = value


def _install_mask(loaded: Any, stack: Stack, attn_modules: list[nn.Module], mask: Any, attention_mask: Any) -> list[Any]:
    """Each self-attention of ``stack`` gets ``mask`` (a schedule: block ``k`` gets ``mask.layer(k)``) and the padding."""
    padding = _padding(loaded, stack, attention_mask, "a replacement mask needs the batch's attention_mask (B, N) "
                       "for padding")
    n = padding.shape[1]
    if isinstance(mask, MaskSchedule):
        if len(attn_modules) != len(stack.blocks):
            raise ModelError("a mask schedule needs one attention module per layer; this model shares its layers")
        pairs = [(parts.self_attn, mask.layer(k)) for k, parts in enumerate(stack.blocks)]
    else:
        check_real_rows(dense_mask(mask, n), padding, getattr(mask, "spec", mask if isinstance(mask, str) else None))
        pairs = [(module, mask) for module in attn_modules]
    values: dict[int, torch.Tensor] = {}  # one additive mask per distinct mask
    for _, m in pairs:
        if id(m) not in values:
            values[id(m)] = additive_mask(dense_mask(m, n), padding, loaded.dtype)
    arg = stack.blocks[0].mask_arg
    return [register_hook(module, "input", _mask_hook(module, arg, values[id(m)])) for module, m in pairs]


def _padding(loaded: Any, stack: Stack, attention_mask: Any, missing: str) -> torch.Tensor:
    """The padding mask ``(B, N)`` of ``stack``'s tokens on the model's device; ConfigError ``missing`` without one."""
    if attention_mask is None:
        raise ConfigError(missing)
    return stack_padding(attention_mask.to(loaded.device), stack.prefix)


def decoder_padding(attention_mask: torch.Tensor) -> torch.Tensor:
    """Padding mask ``(B, N)`` of the right-shifted decoder input."""
    return torch.cat([torch.ones_like(attention_mask[:, :1]), attention_mask[:, :-1]], dim=1)


def stack_padding(attention_mask: torch.Tensor, point: str) -> torch.Tensor:
    """The padding mask ``(B, N)`` of the tokens at ``point`` (or stack prefix): T5's decoder's is shifted right."""
    return decoder_padding(attention_mask) if point.startswith("decoder.") else attention_mask


def _install_clip(loaded: Any, stack: Stack, attention_mask: Any, handles: list[Any]) -> Any:
    """Install a :class:`~rankcollapse.models.massive.MassiveClip` on ``stack``; returns it."""
    from .massive import MassiveClip

    clip = MassiveClip(stack, _padding(loaded, stack, attention_mask, "clip_massive needs the batch's attention_mask "
                                       "(B, N): only real tokens count"))
    handles.extend(clip.install(loaded.model))
    return clip


def _install_drops(loaded: Any, stack: Stack, drop_list: list[str]) -> list[Any]:
    chosen = parse_drop(drop_list, stack.n_layers)
    if "final_norm" in chosen and stack.final_norm is None:
        raise ModelError(f"family {loaded.family!r} ({type(loaded.model).__name__}) has no final norm to drop; "
                         "'final_norm' applies to gpt2, t5 and llama")
    tracker = _BlockTracker(stack)
    handles = [loaded.model.register_forward_pre_hook(tracker.reset)]
    handles.extend(m.register_forward_pre_hook(tracker.enter_block, with_kwargs=True) for m in tracker.modules.values())
    handles.extend(register_hook(module, io, hook) for module, io, hook in _drop_hooks(stack, chosen, tracker))
    return handles
